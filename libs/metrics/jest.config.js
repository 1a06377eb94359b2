import base from '../../jest.base.js';

// fastify.inject (light-my-request) require()s the ESM-only `cookie@2`; Jest on Node 20 cannot require ESM,
// so that one package is compiled to CommonJS for the tests.
export default {
  ...base,
  displayName: '@bis/metrics',
  transform: {
    ...base.transform,
    '/node_modules/cookie/.+\\.js$': ['@swc/jest', { jsc: { target: 'es2022' }, module: { type: 'commonjs' } }],
  },
  transformIgnorePatterns: ['/node_modules/(?!cookie/)'],
};
