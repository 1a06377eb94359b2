#!/usr/bin/env node
// Room on the libuv thread pool for the SHA-512 chain checks of a receive (one job per core) beside its direct writes
// and the sender's file I/O, which otherwise queue behind each other in Node's default 4 threads. Set before anything
// uses the pool; an explicit UV_THREADPOOL_SIZE wins.
process.env.UV_THREADPOOL_SIZE ??= '8';
await import('../dist/main.js');
