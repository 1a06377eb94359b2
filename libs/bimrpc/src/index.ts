export * from './gen/bimrpc.js';
export { Empty } from './gen/google/protobuf/empty.js';
export * from './client.js';
