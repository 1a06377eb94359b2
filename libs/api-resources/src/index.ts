export { downloadUrlPolicyFor, annotationEndpoints } from './deps.js';
export { registerBackingImageResources, type BackingImageApi, backingImageHttpPlugin } from './register.js';
export { SecretService, secretResource } from './secrets.js';
export { eventResource } from './events.js';
