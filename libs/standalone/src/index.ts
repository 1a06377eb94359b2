export { checkRestExposure, startStandalone, type StandaloneHandle } from './standalone.js';
