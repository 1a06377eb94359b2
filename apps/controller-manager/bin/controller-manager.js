#!/usr/bin/env -S node --max-semi-space-size=8
// V8's young generation: semispaces of at most 8 MiB (Node's default is 16). The controllers allocate many short-lived
// copies; with 16 MiB the young generation alone committed 32 MiB. Measured in docs/benchmarks.md (controller-manager,
// memory): 1,000 images, max RSS 191 MiB instead of 210, the same convergence time. A flag that V8 reads only at start,
// hence here: the image's `controller-manager` command and `npm start` run this file through this line.
import '../dist/main.js';
