// Test helpers other projects' tests use (a loopback forward proxy).
export * from './proxy.js';
