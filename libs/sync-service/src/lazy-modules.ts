// The parts of the sync service that only some operations need (the SHA-512 chain addon, the block-mapping addon,
// the peer receiver and sender, qemu-img) are loaded on first use, so that a process that never uses them (a data source
// downloading one image) does not load them at start. Each loader returns the same module every time.

let chainFile: Promise<typeof import('./chain-file.js')> | undefined;
let sha512Chain: Promise<typeof import('@bis/sha512-chain')> | undefined;
let blockMapping: Promise<typeof import('@bis/block-mapping')> | undefined;
let receiver: Promise<typeof import('./ssync/receiver.js')> | undefined;
let qemuImg: Promise<typeof import('@bis/file-sources/qemu-img')> | undefined;
let sender: Promise<typeof import('./ssync/sender.js')> | undefined;

export const loadChainFile = (): Promise<typeof import('./chain-file.js')> => (chainFile ??= import('./chain-file.js'));
export const loadSha512Chain = (): Promise<typeof import('@bis/sha512-chain')> => (sha512Chain ??= import('@bis/sha512-chain'));
export const loadBlockMapping = (): Promise<typeof import('@bis/block-mapping')> => (blockMapping ??= import('@bis/block-mapping'));
export const loadSsyncReceiver = (): Promise<typeof import('./ssync/receiver.js')> => (receiver ??= import('./ssync/receiver.js'));
export const loadSsyncSender = (): Promise<typeof import('./ssync/sender.js')> => (sender ??= import('./ssync/sender.js'));
export const loadQemuImg = (): Promise<typeof import('@bis/file-sources/qemu-img')> => (qemuImg ??= import('@bis/file-sources/qemu-img'));
