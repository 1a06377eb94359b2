export { run, COMMANDS, Exit, helpText } from './cli.js';
