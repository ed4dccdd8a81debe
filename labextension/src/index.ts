import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpu:plugin',
  description: 'GPU side panel',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    console.log('jupyter-gpu activated', app.name);
  }
};

export default plugin;
