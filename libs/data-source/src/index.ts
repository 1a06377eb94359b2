export * from './config.js';
export * from './data-source.js';
export * from './routes.js';
