/**
 * Wires the Kiwi GPU plugins into JupyterLab: the model and its long-poll, NVML's readings, the
 * sidebar panel, the status bar item, the commands and the settings. The behaviour lives in the modules
 * imported.
 */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { canWriteKiwi, changeScheduler, fetchNvml, fetchStatus, hintFront, waitForStatus } from './api';
import { followFocusedKernel, labelKernelsBySession } from './focus';
import { FrontHints } from './front';
import { kiwiIcon } from './icon';
import { KiwiModel } from './model';
import { pollNvml } from './nvml';
import { KiwiPanel } from './panel';
import { StatusPoller } from './poller';
import { KiwiStatusItem } from './statusbar';
import { CommandIDs, DEFAULT_SETTINGS, IKiwiSettings, SchedulerMode } from './tokens';

const PLUGIN_ID = 'kiwi-jupyter:plugin';

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
    const poller = new StatusPoller(model, DEFAULT_SETTINGS.refreshRate, { waitForStatus, fetchStatus });

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
    // NVML's figures (memory used, utilization) while the panel is open, as nvdashboard shows.
    pollNvml({ read: fetchNvml, take: reading => model.setNvml(reading), shown: () => panel.isVisible });
    canWriteKiwi().then(
      allowed => (panel.canWrite = allowed),
      () => (panel.canWrite = false)
    );

    const frontHints = new FrontHints(hintFront);
    followFocusedKernel(model, labShell, kernelId => frontHints.front(kernelId));
    labelKernelsBySession(model, app.serviceManager.sessions);

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
