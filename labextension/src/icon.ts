import { LabIcon } from '@jupyterlab/ui-components';

/** A chip: a square die with pins on every side; `jp-icon3` follows the theme's icon colour. */
const CHIP_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2zm0 2v10h10V7H7z"/>
    <rect x="9.5" y="9.5" width="5" height="5" rx="0.5"/>
    <rect x="8" y="1.5" width="2" height="3"/><rect x="14" y="1.5" width="2" height="3"/>
    <rect x="8" y="19.5" width="2" height="3"/><rect x="14" y="19.5" width="2" height="3"/>
    <rect x="1.5" y="8" width="3" height="2"/><rect x="1.5" y="14" width="3" height="2"/>
    <rect x="19.5" y="8" width="3" height="2"/><rect x="19.5" y="14" width="3" height="2"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'jupyter-gpu:chip', svgstr: CHIP_SVG });
