// Shared jest configuration: native ESM, TypeScript transformed by @swc/jest.
// Every embedded store of the tests (and of the processes they start) deep-freezes its committed objects: a reader that
// changes an object it got shared (listShared, getShared, an informer's cache) fails its test instead of silently
// changing the store's state.
process.env.BIS_DATASTORE_FREEZE ??= '1';
// Workspace packages resolve to their TypeScript sources through the "development" export condition.
export default {
  testEnvironment: 'node',
  testTimeout: 60000,
  extensionsToTreatAsEsm: ['.ts'],
  testEnvironmentOptions: { customExportConditions: ['development', 'node', 'node-addons'] },
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  transform: {
    '^.+\\.ts$': [
      '@swc/jest',
      { jsc: { target: 'es2022', parser: { syntax: 'typescript' } }, module: { type: 'es6' } },
    ],
  },
  testMatch: ['<rootDir>/src/**/*.spec.ts', '<rootDir>/test/**/*.spec.ts'],
  // `*.alone.spec.ts`: a test that rewrites the workspace's built files (it runs `npm start`, whose build restores them
  // from Nx's cache), which would pull a module from under a process another test just started. `npm test` runs the
  // other tests first (BIS_TEST_PHASE=shared), then these, one project at a time (BIS_TEST_PHASE=alone). Without
  // BIS_TEST_PHASE (jest run by hand) every test runs.
  testPathIgnorePatterns: ['/node_modules/', ...(process.env.BIS_TEST_PHASE === 'shared' ? ['\\.alone\\.spec\\.ts$'] : [])],
  ...(process.env.BIS_TEST_PHASE === 'alone' ? { testMatch: ['<rootDir>/src/**/*.alone.spec.ts', '<rootDir>/test/**/*.alone.spec.ts'] } : {}),
};
