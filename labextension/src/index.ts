/**
 * Wires the Kiwi GPU plugins into JupyterLab: the model and its poller, the sidebar panel, the
 * status bar item, the commands and the settings. The behaviour lives in the modules imported.
 */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, ISessionContext } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { canWriteKiwi, changeScheduler } from './api';
import { KiwiModel } from './model';
import { KiwiPanel } from './panel';
import { StatusPoller } from './poller';
import { KiwiStatusItem } from './statusbar';
import { CommandIDs, DEFAULT_SETTINGS, IKiwiSettings, SchedulerMode } from './tokens';

const PLUGIN_ID = 'kiwi-jupyter:plugin';

const kiwiIcon = new LabIcon({
  name: 'kiwi-jupyter:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">' +
    '<g class="jp-icon3" fill="#616161"><rect x="2" y="4" width="12" height="8" rx="1"/>' +
    '<rect x="4" y="1" width="1.5" height="3"/><rect x="7.25" y="1" width="1.5" height="3"/>' +
    '<rect x="10.5" y="1" width="1.5" height="3"/><rect x="4" y="12" width="1.5" height="3"/>' +
    '<rect x="7.25" y="12" width="1.5" height="3"/><rect x="10.5" y="12" width="1.5" height="3"/></g></svg>'
});

/** The kernel of a main-area widget (notebook or console), if it has one. */
function kernelIdOf(widget: Widget | null): string | null {
  const context = (widget as { sessionContext?: ISessionContext } | null)?.sessionContext;
  return context?.session?.kernel?.id ?? null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The Kiwi GPU panel: who holds the shared GPU, the queue, pools and controls.',
  autoStart: true,
  optional: [ILabShell, ILayoutRestorer, ISettingRegistry, IStatusBar, ICommandPalette, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    translator: ITranslator | null
  ) => {
    translator = translator ?? nullTranslator;
    const trans = translator.load('kiwi_jupyter');
    const model = new KiwiModel({ timelineWindow: DEFAULT_SETTINGS.timelineWindow });
    const poller = new StatusPoller(model, DEFAULT_SETTINGS.refreshRate);

    const panel = new KiwiPanel({
      model,
      translator,
      changeScheduler: async change => {
        model.update(await changeScheduler(change), Date.now() / 1000);
      }
    });
    panel.title.icon = kiwiIcon;
    app.shell.add(panel, 'left', { rank: 900 });
    restorer?.add(panel, 'kiwi-gpu-panel');
    canWriteKiwi().then(
      allowed => (panel.canWrite = allowed),
      () => (panel.canWrite = false)
    );

    // Follow the notebook (or console) in focus and its kernel, which registers with the daemon
    // under its Jupyter kernel id.
    let watched: ISessionContext | null = null;
    const followKernel = () => {
      const widget = labShell?.currentWidget ?? null;
      const context = (widget as { sessionContext?: ISessionContext } | null)?.sessionContext ?? null;
      if (context !== watched) {
        watched?.kernelChanged.disconnect(followKernel);
        context?.kernelChanged.connect(followKernel);
        watched = context;
      }
      model.kernelId = kernelIdOf(widget);
    };
    labShell?.currentChanged.connect(followKernel);
    followKernel();

    // Name kernels after their notebooks in the queue and timeline.
    const sessions = app.serviceManager.sessions;
    const labelKernels = () => {
      const labels = new Map<string, string>();
      for (const session of sessions.running()) {
        if (session.kernel) {
          labels.set(session.kernel.id, PathExt.basename(session.path));
        }
      }
      model.setKernelLabels(labels);
      followKernel();
    };
    sessions.runningChanged.connect(labelKernels);
    labelKernels();

    app.commands.addCommand(CommandIDs.openPanel, {
      label: trans.__('Show the Kiwi GPU panel'),
      execute: () => app.shell.activateById(panel.id)
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: trans.__('Refresh the Kiwi GPU status'),
      execute: () => poller.refresh()
    });
    app.commands.addCommand(CommandIDs.setMode, {
      label: args => trans.__('Set the Kiwi scheduler mode to %1', String(args.mode ?? 'on').toUpperCase()),
      execute: async args => {
        model.update(await changeScheduler({ mode: (args.mode ?? 'on') as SchedulerMode }), Date.now() / 1000);
      }
    });
    if (palette) {
      const category = trans.__('Kiwi GPU');
      palette.addItem({ command: CommandIDs.openPanel, category });
      palette.addItem({ command: CommandIDs.refresh, category });
      for (const mode of ['on', 'off', 'auto']) {
        palette.addItem({ command: CommandIDs.setMode, category, args: { mode } });
      }
    }

    if (statusBar) {
      const item = new KiwiStatusItem(model, trans, () => app.shell.activateById(panel.id));
      statusBar.registerStatusItem('kiwi-jupyter:status', { item, align: 'left', rank: 4 });
    }

    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        const values = { ...DEFAULT_SETTINGS, ...(settings.composite as Partial<IKiwiSettings>) };
        poller.refreshRate = values.refreshRate;
        model.timelineWindow = values.timelineWindow;
      };
      settingRegistry.load(PLUGIN_ID).then(
        settings => {
          apply(settings);
          settings.changed.connect(apply);
        },
        reason => console.error('kiwi-jupyter: could not load settings', reason)
      );
    }
  }
};

export default plugin;
