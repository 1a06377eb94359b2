export { parseHostPort, formatHostPort, HostPortError, type HostPort, type ParseHostPortOptions } from './host-port.js';
