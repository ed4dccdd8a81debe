/**
 * jupyter-gpu: a right side-bar panel with each GPU's utilisation and memory history, who holds its
 * memory (which notebook, idle for how long) and the server's alerts. The data comes from the
 * jupyter_gpu server extension (`jupyter-gpu/api/metrics` and `/status`).
 */

import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { gpuIcon } from './icon';
import { parseSettings } from './model';
import { GpuPanel, PANEL_ID } from './panel';
import { GpuStatusItem, STATUS_ITEM_ID } from './statusbar';

const PLUGIN_ID = 'jupyter-gpu:plugin';

namespace CommandIDs {
  export const open = 'jupyter-gpu:open';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU side panel: live utilisation and memory, which notebook holds the GPU, alerts.',
  autoStart: true,
  optional: [ILayoutRestorer, ISettingRegistry, ICommandPalette, IStatusBar, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    registry: ISettingRegistry | null,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null
  ): void => {
    const panel = new GpuPanel({
      openPath: (path: string) => {
        void app.commands.execute('docmanager:open', { path });
      }
    });
    app.shell.add(panel, 'right', { rank: 900 });
    if (restorer) {
      restorer.add(panel, PANEL_ID);
    }

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show the GPU Panel',
      caption: 'GPU utilisation, memory and who holds it',
      icon: args => (args.isPalette ? undefined : gpuIcon),
      execute: () => {
        app.shell.activateById(panel.id);
      }
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.open, category: 'GPU' });
    }

    const item = new GpuStatusItem({
      panel,
      currentKernel: () => currentKernelId(app),
      open: () => app.shell.activateById(panel.id)
    });
    if (statusBar) {
      statusBar.registerStatusItem(STATUS_ITEM_ID, { item, align: 'left', rank: 50 });
    } else {
      // Notebook 7 has no status bar: the item goes in its top bar, beside the kernel's logo, on every page.
      item.addClass('jp-GpuStatus-top');
      app.shell.add(item, 'top', { rank: 1000 });
    }
    // Another notebook in focus: its kernel's GPUs, at once rather than at the next reading.
    labShell?.currentChanged.connect(() => item.update());

    if (registry) {
      registry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = (): void => {
            panel.settings = parseSettings(settings.composite);
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.warn('jupyter-gpu: could not load the panel settings, using the defaults.', reason);
        });
    }
  }
};

/**
 * The kernel of the notebook or console in the main area's focus. Read by shape (a `sessionContext` with a
 * session), so no notebook package is needed: any document with a kernel counts.
 */
function currentKernelId(app: JupyterFrontEnd): string | null {
  const widget = app.shell.currentWidget as { sessionContext?: { session?: { kernel?: { id?: string } | null } | null } } | null;
  return widget?.sessionContext?.session?.kernel?.id ?? null;
}

export default plugin;
