/**
 * File offsets, lengths and buffer addresses of direct writes are multiples of this: the page size, which is also the
 * largest logical block size of common devices (a smaller one divides it).
 */
export const DIRECT_IO_ALIGNMENT = 4096;

const WASM_PAGE = 65536;

/** The part of the WebAssembly global used here (the project's TypeScript libs do not include its types). */
declare const WebAssembly: {
  Memory: new (descriptor: { initial: number; maximum?: number; shared?: boolean }) => { readonly buffer: ArrayBufferLike };
};

/** The memories handed out by `alignedBuffer`: a view of one at a 4096-multiple offset is aligned. */
const alignedMemories = new WeakSet<ArrayBufferLike>();

export interface AlignedBufferOptions {
  /** Back the buffer with a SharedArrayBuffer (for worker threads). Default false. */
  shared?: boolean;
}

/**
 * A zero-filled buffer of `size` bytes whose first byte is at a page-aligned address, as `O_DIRECT` needs.
 *
 * JavaScript cannot see addresses, and ordinary array buffers come from malloc (16-byte aligned). The memory of a
 * `WebAssembly.Memory` is mapped by V8 on page boundaries, so a view at its start is aligned. The memory is freed by
 * the garbage collector like any array buffer. A writer that still gets EINVAL from a direct write with it falls back
 * to buffered writes (see `DirectFileWriter`).
 */
export function alignedBuffer(size: number, options: AlignedBufferOptions = {}): Buffer {
  if (!Number.isSafeInteger(size) || size <= 0) throw new RangeError(`aligned buffer size must be a positive integer, got ${String(size)}`);
  const pages = Math.ceil(size / WASM_PAGE);
  if (pages > 65536) throw new RangeError(`aligned buffer size ${size} is larger than 4 GiB`);
  const memory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared: options.shared === true }).buffer;
  alignedMemories.add(memory);
  return Buffer.from(memory, 0, size);
}

/** Whether `view` starts at an aligned address: it lies in a buffer from `alignedBuffer`, at a multiple of 4096. */
export function isAlignedView(view: Uint8Array): boolean {
  return alignedMemories.has(view.buffer) && view.byteOffset % DIRECT_IO_ALIGNMENT === 0;
}
