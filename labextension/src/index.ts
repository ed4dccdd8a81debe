/**
 * jupyter-gpu: a right side-bar panel with each GPU's utilisation and memory history, who holds its
 * memory (which notebook, idle for how long) and the server's alerts. The data comes from the
 * jupyter_gpu server extension (`jupyter-gpu/api/metrics` and `/status`).
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { gpuIcon } from './icon';
import { parseSettings } from './model';
import { GpuPanel, PANEL_ID } from './panel';

const PLUGIN_ID = 'jupyter-gpu:plugin';

namespace CommandIDs {
  export const open = 'jupyter-gpu:open';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU side panel: live utilisation and memory, which notebook holds the GPU, alerts.',
  autoStart: true,
  optional: [ILayoutRestorer, ISettingRegistry, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    registry: ISettingRegistry | null,
    palette: ICommandPalette | null
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

export default plugin;
