// Test helpers for other projects' end-to-end tests: the real standalone system as a child process.
export * from './standalone-process.js';
