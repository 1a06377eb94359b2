export { uiServerPlugin, type UiServerOptions } from './ui-server.js';
