export { createLogger, lineStream, messageLog, type CreateLoggerOptions, type Logger, type LogLevel, type RootLogger } from './logger.js';
