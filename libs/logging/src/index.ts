export { createLogger, lineStream, messageLog, type CreateLoggerOptions, type LogDestination, type Logger, type LogLevel, type RootLogger } from './logger.js';
