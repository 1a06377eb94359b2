import { constants, promises as fsp } from 'node:fs';
import path from 'node:path';

/**
 * Path confinement for everything that names a file on a disk: `(disk root, name, uuid, file-path parameter)` →
 * one absolute path inside the disk root, in Longhorn's on-disk layout, or a {@link DiskPathError}.
 *
 * The layout (Longhorn's): `<disk>/backing-images/<name>-<uuid>/backing` (a copy kept by a manager) and
 * `<disk>/tmp/<name>-<uuid>` (a data source's file). Beside those files live `<file>.tmp`, `<file>.cfg` and other
 * suffixed siblings, which callers derive from the confined path.
 */

/** Longhorn's BackingImage name rule (webhook validator): lower-case letters, digits, `_`, `.`, `-`; at least 2. */
export const BACKING_IMAGE_NAME_PATTERN = /^[a-z0-9][a-z0-9_.-]+$/;
/** Kubernetes' object name limit (the webhook mutator cuts names to 40; older objects may be longer). */
export const BACKING_IMAGE_NAME_MAX_LENGTH = 253;
/** A backing-image UUID (Longhorn: 8 random hex characters): letters, digits, `_`, `.`, `-`, not starting with a dot or dash. */
export const BACKING_IMAGE_UUID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
export const BACKING_IMAGE_UUID_MAX_LENGTH = 64;
/**
 * Longest `<name>-<uuid>` directory or file name: a file name holds 255 bytes, and the longest suffix a component
 * adds to it is 13 (`.export-qcow2`, `.tmp.qcow2tmp`), with a little room.
 */
export const ENTRY_NAME_MAX_LENGTH = 240;
/** Longest path accepted (Linux `PATH_MAX`). */
export const PATH_MAX_LENGTH = 4095;

export const BACKING_IMAGES_DIR = 'backing-images';
export const DISK_TMP_DIR = 'tmp';
export const BACKING_FILE_NAME = 'backing';

/** Why a path was refused. */
export type DiskPathReason =
  | 'empty'
  | 'nul-byte'
  | 'too-long'
  | 'not-absolute'
  | 'dot-segment'
  | 'outside-root'
  | 'not-in-layout'
  | 'invalid-name'
  | 'invalid-uuid'
  | 'uuid-mismatch'
  | 'name-mismatch'
  | 'symlink'
  | 'invalid-root';

/**
 * A refused path: names the parameter at fault (`file-path`, `name`, `uuid`, …) and why. Servers answer it with
 * gRPC `INVALID_ARGUMENT` / HTTP 400; it is thrown before anything is created, changed or removed.
 */
export class DiskPathError extends Error {
  override readonly name = 'DiskPathError';
  /** HTTP status a server answers with. */
  readonly httpStatus = 400;
  constructor(
    /** The request parameter at fault, as the caller spells it (e.g. `file-path`, `name`). */
    readonly parameter: string,
    readonly reason: DiskPathReason,
    readonly value: string,
    detail: string,
  ) {
    super(`invalid ${parameter} ${quote(value)}: ${detail}`);
  }
}

export function isDiskPathError(err: unknown): err is DiskPathError {
  return err instanceof DiskPathError;
}

/** A value for messages: JSON-quoted (a NUL or a newline stays visible), cut to 300 characters. */
function quote(value: string): string {
  const q = JSON.stringify(value);
  return q.length > 300 ? `${q.slice(0, 297)}…"` : q;
}

/** Which file of the layout a path names. */
export type DiskFileKind = 'backing-file' | 'backing-dir' | 'data-source-file';

export interface DiskPathRequest {
  /** The disk root (absolute), e.g. `/data/`. */
  root: string;
  /** Which file of the layout is wanted; with `filePath`, `any` accepts a backing file or a data-source file. */
  kind: DiskFileKind | 'any';
  /** The backing-image name (checked against Longhorn's name rule). */
  name?: string;
  /** The backing-image UUID. */
  uuid?: string;
  /** A path parameter (the sync service's `file-path`, `src-file-path`, `dst-file-path`, a `/v1/files/{id}`). */
  filePath?: string;
  /** How the caller's parameters are spelt, for messages (default `name`, `uuid`, `file-path`). */
  parameters?: { name?: string; uuid?: string; filePath?: string };
}

/** A confined path and what it names. */
export interface DiskPath {
  path: string;
  kind: DiskFileKind;
  /** The `<name>-<uuid>` entry (directory of a backing file, or the data-source file's name). */
  entry: string;
}

function checkString(parameter: string, value: string, max: number): void {
  if (value === '') throw new DiskPathError(parameter, 'empty', value, 'it is empty');
  if (value.includes('\0')) throw new DiskPathError(parameter, 'nul-byte', value, 'it contains a NUL byte');
  if (value.length > max) throw new DiskPathError(parameter, 'too-long', value, `it is ${value.length} characters long, more than ${max}`);
}

/** Checks a backing-image name against Longhorn's name rule. */
export function checkBackingImageName(name: string, parameter = 'name'): string {
  checkString(parameter, name, BACKING_IMAGE_NAME_MAX_LENGTH);
  if (!BACKING_IMAGE_NAME_PATTERN.test(name)) {
    throw new DiskPathError(parameter, 'invalid-name', name, `a backing image name must match ${BACKING_IMAGE_NAME_PATTERN.source}`);
  }
  return name;
}

/** Checks a backing-image UUID. */
export function checkBackingImageUUID(uuid: string, parameter = 'uuid'): string {
  checkString(parameter, uuid, BACKING_IMAGE_UUID_MAX_LENGTH);
  if (!BACKING_IMAGE_UUID_PATTERN.test(uuid)) {
    throw new DiskPathError(parameter, 'invalid-uuid', uuid, `a backing image uuid must match ${BACKING_IMAGE_UUID_PATTERN.source}`);
  }
  return uuid;
}

/** The disk root as an absolute, normalised path without a trailing slash. */
export function normalizeRoot(root: string): string {
  if (root === '' || root.includes('\0') || !path.isAbsolute(root)) {
    throw new DiskPathError('disk path', 'invalid-root', root, 'the disk root must be an absolute path');
  }
  const r = path.resolve(root);
  if (r === '/') throw new DiskPathError('disk path', 'invalid-root', root, 'the disk root cannot be /');
  return r;
}

function entryOf(name: string, uuid: string, p: { name: string; uuid: string }): string {
  checkBackingImageName(name, p.name);
  checkBackingImageUUID(uuid, p.uuid);
  const entry = `${name}-${uuid}`;
  if (entry.length > ENTRY_NAME_MAX_LENGTH) {
    throw new DiskPathError(p.name, 'too-long', name, `<name>-<uuid> is ${entry.length} characters long, more than ${ENTRY_NAME_MAX_LENGTH}`);
  }
  return entry;
}

function build(root: string, kind: DiskFileKind, entry: string): string {
  switch (kind) {
    case 'backing-dir':
      return path.join(root, BACKING_IMAGES_DIR, entry);
    case 'backing-file':
      return path.join(root, BACKING_IMAGES_DIR, entry, BACKING_FILE_NAME);
    case 'data-source-file':
      return path.join(root, DISK_TMP_DIR, entry);
  }
}

/**
 * THE path function: turns `(disk root, name, uuid, file-path parameter)` into a path inside the disk root, in the
 * layout, or throws a {@link DiskPathError} naming the parameter at fault. Purely lexical (no file system access):
 * {@link confineDiskPath} adds the symlink check.
 *
 * * Without `filePath`: `name` and `uuid` must be given and valid; the path is built from them.
 * * With `filePath` (Longhorn's sync API carries absolute paths such as `/data/backing-images/<n>-<u>/backing`): it
 *   must be absolute, without NUL, `.` or `..` segments or an empty segment, inside the root, and name a file of
 *   the layout (`kind`, or either file for `any`). When `uuid` is given the entry must be `<name>-<uuid>` with a valid
 *   name (and equal to `name` when that is given too); without it, the entry must still be a valid
 *   `<name>-<uuid>`-shaped name.
 */
export function resolveDiskPath(req: DiskPathRequest): DiskPath {
  const root = normalizeRoot(req.root);
  const p = { name: req.parameters?.name ?? 'name', uuid: req.parameters?.uuid ?? 'uuid', filePath: req.parameters?.filePath ?? 'file-path' };
  if (req.filePath === undefined) {
    if (req.kind === 'any') throw new DiskPathError(p.filePath, 'empty', '', 'a file path is required');
    const entry = entryOf(req.name ?? '', req.uuid ?? '', p);
    return { path: build(root, req.kind, entry), kind: req.kind, entry };
  }
  const fp = req.filePath;
  checkString(p.filePath, fp, PATH_MAX_LENGTH);
  if (!path.isAbsolute(fp)) {
    throw new DiskPathError(p.filePath, 'not-absolute', fp, `it must be an absolute path under the disk root ${root}`);
  }
  const segments = fp.split('/').slice(1);
  if (segments.some((s) => s === '..' || s === '.')) {
    throw new DiskPathError(p.filePath, 'dot-segment', fp, 'it must not contain "." or ".." segments');
  }
  if (segments.some((s) => s === '')) {
    throw new DiskPathError(p.filePath, 'not-in-layout', fp, 'it must not contain empty segments or end with "/"');
  }
  if (!fp.startsWith(root + '/')) {
    throw new DiskPathError(p.filePath, 'outside-root', fp, `it is outside the disk root ${root}`);
  }
  const rel = fp.slice(root.length + 1).split('/');
  let kind: DiskFileKind | undefined;
  if (rel.length === 3 && rel[0] === BACKING_IMAGES_DIR && rel[2] === BACKING_FILE_NAME) kind = 'backing-file';
  else if (rel.length === 2 && rel[0] === BACKING_IMAGES_DIR) kind = 'backing-dir';
  else if (rel.length === 2 && rel[0] === DISK_TMP_DIR) kind = 'data-source-file';
  const wanted = kind !== undefined && (req.kind === 'any' ? kind !== 'backing-dir' : kind === req.kind);
  if (kind === undefined || !wanted) {
    throw new DiskPathError(p.filePath, 'not-in-layout', fp, `it is not ${layoutText(root, req.kind)}`);
  }
  const entry = rel[1]!;
  if (req.uuid !== undefined) {
    checkBackingImageUUID(req.uuid, p.uuid);
    if (!entry.endsWith(`-${req.uuid}`)) {
      throw new DiskPathError(p.filePath, 'uuid-mismatch', fp, `its entry ${entry} does not end with -<uuid> (-${req.uuid})`);
    }
    const name = entry.slice(0, -(req.uuid.length + 1));
    try {
      entryOf(name, req.uuid, p);
    } catch (err) {
      if (!(err instanceof DiskPathError)) throw err;
      throw new DiskPathError(p.filePath, err.reason, fp, `its backing image name: ${err.message}`);
    }
    if (req.name !== undefined && req.name !== name) {
      throw new DiskPathError(p.filePath, 'name-mismatch', fp, `it names backing image ${name}, not ${req.name}`);
    }
  } else {
    if (entry.length > ENTRY_NAME_MAX_LENGTH) {
      throw new DiskPathError(p.filePath, 'too-long', fp, `its entry is ${entry.length} characters long, more than ${ENTRY_NAME_MAX_LENGTH}`);
    }
    if (!splitsIntoNameAndUUID(entry)) {
      throw new DiskPathError(p.filePath, 'invalid-name', fp, `its entry ${entry} is not <name>-<uuid> with a valid name and uuid`);
    }
  }
  return { path: fp, kind, entry };
}

/** Whether some `-` splits `entry` into a valid backing-image name and a valid uuid (the uuid itself may hold dashes). */
function splitsIntoNameAndUUID(entry: string): boolean {
  for (let i = entry.indexOf('-'); i > 0; i = entry.indexOf('-', i + 1)) {
    const name = entry.slice(0, i);
    const uuid = entry.slice(i + 1);
    if (
      name.length <= BACKING_IMAGE_NAME_MAX_LENGTH &&
      BACKING_IMAGE_NAME_PATTERN.test(name) &&
      uuid.length <= BACKING_IMAGE_UUID_MAX_LENGTH &&
      BACKING_IMAGE_UUID_PATTERN.test(uuid)
    ) {
      return true;
    }
  }
  return false;
}

function layoutText(root: string, kind: DiskFileKind | 'any'): string {
  const backing = `${root}/${BACKING_IMAGES_DIR}/<name>-<uuid>/${BACKING_FILE_NAME}`;
  const tmp = `${root}/${DISK_TMP_DIR}/<name>-<uuid>`;
  switch (kind) {
    case 'backing-file':
      return backing;
    case 'backing-dir':
      return `${root}/${BACKING_IMAGES_DIR}/<name>-<uuid>`;
    case 'data-source-file':
      return tmp;
    case 'any':
      return `${backing} or ${tmp}`;
  }
}

/**
 * {@link resolveDiskPath}, then the file system check: every component of the path that exists is looked at below
 * the root; a symbolic link among them is refused when it leads out of the root (compared with the root's realpath,
 * so a disk mounted through a link keeps working), and the named file itself must not be a symbolic link at all
 * (it would be read, served, renamed over or removed in its target's place).
 */
export async function confineDiskPath(req: DiskPathRequest): Promise<DiskPath> {
  const r = resolveDiskPath(req);
  await assertNoEscapingLinks(req.root, r.path, req.parameters?.filePath ?? (req.filePath !== undefined ? 'file-path' : req.parameters?.name ?? 'name'));
  return r;
}

/**
 * The symlink half of the confinement for a path already known to be lexically inside `root`: walks the existing
 * components below the root; a link that resolves outside `realpath(root)` is refused, and so is a final component
 * that is a link.
 */
export async function assertNoEscapingLinks(root: string, target: string, parameter: string): Promise<void> {
  const base = normalizeRoot(root);
  let realRoot: string;
  try {
    realRoot = await fsp.realpath(base);
  } catch {
    return; // no disk yet: nothing below it exists, so no link can lead out
  }
  const rel = path.relative(base, target);
  if (rel === '' || rel.startsWith('..') || path.isAbsolute(rel)) {
    throw new DiskPathError(parameter, 'outside-root', target, `it is outside the disk root ${base}`);
  }
  const parts = rel.split(path.sep);
  let cur = base;
  for (let i = 0; i < parts.length; i++) {
    cur = path.join(cur, parts[i]!);
    let st;
    try {
      st = await fsp.lstat(cur);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return; // nothing further exists
      throw err;
    }
    if (!st.isSymbolicLink()) continue;
    if (i === parts.length - 1) {
      throw new DiskPathError(parameter, 'symlink', target, `${cur} is a symbolic link`);
    }
    let real: string;
    try {
      real = await fsp.realpath(cur);
    } catch {
      throw new DiskPathError(parameter, 'symlink', target, `${cur} is a dangling symbolic link`);
    }
    if (real !== realRoot && !real.startsWith(realRoot + path.sep)) {
      throw new DiskPathError(parameter, 'symlink', target, `${cur} is a symbolic link leading out of the disk root to ${real}`);
    }
  }
}

/**
 * Confines a path that is not a layout file (the backup engine's restore output): absolute, or relative to the root;
 * no NUL, no `.`/`..` segments; inside the root; no symbolic link leading out of it, and not a link itself.
 */
export async function confineToRoot(root: string, target: string, parameter: string): Promise<string> {
  const base = normalizeRoot(root);
  checkString(parameter, target, PATH_MAX_LENGTH);
  const segments = target.split('/');
  if (segments.some((s) => s === '..' || s === '.')) {
    throw new DiskPathError(parameter, 'dot-segment', target, 'it must not contain "." or ".." segments');
  }
  const abs = path.isAbsolute(target) ? path.resolve(target) : path.resolve(base, target);
  if (!abs.startsWith(base + '/')) throw new DiskPathError(parameter, 'outside-root', target, `it is outside the disk root ${base}`);
  await assertNoEscapingLinks(base, abs, parameter);
  return abs;
}

/** `open(2)` flags for reading a file without following a symbolic link at its last component. */
export const READ_NOFOLLOW = constants.O_RDONLY | constants.O_NOFOLLOW;
/** `open(2)` flags for creating or truncating a file for writing without following a symbolic link. */
export const WRITE_NOFOLLOW = constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW;
