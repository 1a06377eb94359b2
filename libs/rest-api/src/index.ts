export * from './schema.js';
export * from './errors.js';
export { ApiRegistry, restApiPlugin, baseUrlOf, parseGoDuration, parseJsonText, type ApiContext, type ApiResource, type ApiInput, type ResourceHandlers, type ResourceDefinition, type RestApiOptions } from './api.js';
export { SettingKind, SettingsService, settingsResource, SETTING_SCHEMA, type SettingObject, type SettingView, type SettingDefinitionBody, type SettingsServiceOptions } from './settings.js';
export { REST_OPEN_PATHS, WEBSOCKET_TOKEN_PARAM, isLoopbackHost, restAuthHook } from './auth.js';
export { HEALTHZ_PATHS, controllersHealthCheck, healthReport, registerHealthz, storeHealthCheck, type HealthCheck, type HealthReport, type HealthzOptions } from './healthz.js';
