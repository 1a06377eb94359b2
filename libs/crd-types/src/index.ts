export * from './schema/model.js';
export * from './schema/errors.js';
export * from './schema/validate.js';
export * from './schema/openapi.js';
export * from './enums.js';
export * from './meta.js';
export * from './kinds/index.js';
export * from './validate-object.js';
