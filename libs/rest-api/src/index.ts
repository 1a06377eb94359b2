export { type TypeSchema } from './schema.js';
export { statusOf, messageChain, errorBody, ApiError, notFound } from './errors.js';
export {
  ApiRegistry,
  restApiPlugin,
  baseUrlOf,
  parseJsonText,
  type ApiContext,
  type ApiResource,
  type ApiInput,
  type ResourceDefinition,
} from './api.js';
export { SettingsService, settingsResource } from './settings.js';
export { isLoopbackHost, restAuthHook } from './auth.js';
export { HEALTHZ_PATHS, controllersHealthCheck, healthReport, registerHealthz, storeHealthCheck, type HealthCheck, type HealthReport, type HealthzOptions } from './healthz.js';
