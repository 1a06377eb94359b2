export { validateDataSourceConfig } from './config.js';
export { DataSource } from './data-source.js';
export { dataSourceRoutes } from './routes.js';
export { buildDataSourceApp, SharedInstanceServers, type InstanceServer } from './servers.js';
