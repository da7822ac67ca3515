/**
 * Which kernel is "this notebook's": the kernel of the main-area widget in focus (a notebook or
 * a console), followed across focus and kernel changes; and readable names for kernel ids from
 * the running sessions. Kernels register with the daemon under their Jupyter kernel id.
 */

import { ILabShell } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { Session } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { KiwiModel } from './model';

function sessionContextOf(widget: Widget | null): ISessionContext | null {
  return (widget as { sessionContext?: ISessionContext } | null)?.sessionContext ?? null;
}

/**
 * Keep `model.kernelId` on the focused widget's kernel; `onFront` hears the kernel of each
 * widget brought to the front (FrontHints).
 */
export function followFocusedKernel(
  model: KiwiModel,
  labShell: ILabShell | null,
  onFront?: (kernelId: string | null) => void
): void {
  let watched: ISessionContext | null = null;
  const follow = () => {
    const context = sessionContextOf(labShell?.currentWidget ?? null);
    if (context !== watched) {
      watched?.kernelChanged.disconnect(follow);
      context?.kernelChanged.connect(follow);
      watched = context;
    }
    model.kernelId = context?.session?.kernel?.id ?? null;
  };
  labShell?.currentChanged.connect(() => {
    follow();
    onFront?.(model.kernelId);
  });
  follow();
}

/** Name kernels after their notebooks (or consoles) in the queue and the timeline. */
export function labelKernelsBySession(model: KiwiModel, sessions: Session.IManager): void {
  const label = () => {
    const labels = new Map<string, string>();
    for (const session of sessions.running()) {
      if (session.kernel) {
        labels.set(session.kernel.id, PathExt.basename(session.path));
      }
    }
    model.setKernelLabels(labels);
  };
  sessions.runningChanged.connect(label);
  label();
  // A kernel started from another tab or browser shows in the scheduler's document before this
  // page's session list polls again: ask for the list then, at most every few seconds.
  let asked = 0;
  model.changed.connect(() => {
    const now = Date.now();
    if (now - asked > REFRESH_SESSIONS_MS && model.unlabelledKernels().length > 0) {
      asked = now;
      void sessions.refreshRunning();
    }
  });
}

/** Least milliseconds between two session-list refreshes asked for unnamed kernels. */
const REFRESH_SESSIONS_MS = 3000;
