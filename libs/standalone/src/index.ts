export * from './standalone.js';
export * from './process-data-plane.js';
export * from './ports.js';
