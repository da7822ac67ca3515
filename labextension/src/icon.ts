/** The Kiwi GPU icon (a chip), coloured by the theme through the jp-icon3 class. */

import { LabIcon } from '@jupyterlab/ui-components';

export const kiwiIcon = new LabIcon({
  name: 'kiwi-jupyter:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">' +
    '<g class="jp-icon3" fill="#616161"><rect x="2" y="4" width="12" height="8" rx="1"/>' +
    '<rect x="4" y="1" width="1.5" height="3"/><rect x="7.25" y="1" width="1.5" height="3"/>' +
    '<rect x="10.5" y="1" width="1.5" height="3"/><rect x="4" y="12" width="1.5" height="3"/>' +
    '<rect x="7.25" y="12" width="1.5" height="3"/><rect x="10.5" y="12" width="1.5" height="3"/></g></svg>'
});
