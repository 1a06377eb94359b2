import { promises as fsp } from 'node:fs';
import os from 'node:os';
import http from 'node:http';
import path from 'node:path';

/**
 * Test support for path confinement: a sandbox (a temp dir holding the disk root and sibling "victim" files and
 * directories, with symbolic links planted inside the disk that lead out of it), a snapshot of everything outside
 * the disk root (sizes and mtimes), and the table of traversal attempts every API surface is tried with.
 */

export interface Sandbox {
  /** The temp dir holding everything. */
  base: string;
  /** The disk root (`<base>/disk`), with `longhorn-disk.cfg`, `backing-images/` and `tmp/`. */
  root: string;
  /** A victim file beside the disk. */
  victimFile: string;
  /** `<base>/victim-x`: the directory the reported gRPC Delete removed (`name ../../victim`, `uuid x`). */
  victimEntry: string;
  /** A directory the planted links point to (holds a `backing` file). */
  victimDir: string;
  /** A sibling whose name starts with the disk root's (`<base>/disk-evil`): a prefix check must not accept it. */
  prefixSibling: string;
  remove(): Promise<void>;
}

export const DISK_UUID = 'disk-confinement';

/**
 * Creates the sandbox. Planted inside the disk (links leading out of it):
 * `backing-images/evil-x` → victim dir, `tmp/lnk-x` → victim file, `backing-images/file-x/backing` → victim file,
 * `backing-images/up-x` → `../..` (relative: the sandbox base), `backing-images/lnk-x` → `../tmp/lnk-x` (a chain).
 */
export async function createSandbox(prefix = 'confinement-'): Promise<Sandbox> {
  const base = await fsp.realpath(await fsp.mkdtemp(path.join(os.tmpdir(), prefix)));
  const root = path.join(base, 'disk');
  const victimFile = path.join(base, 'victim.txt');
  const victimEntry = path.join(base, 'victim-x');
  const victimDir = path.join(base, 'victim-dir');
  const prefixSibling = path.join(base, 'disk-evil');
  await fsp.mkdir(path.join(root, 'backing-images'), { recursive: true });
  await fsp.mkdir(path.join(root, 'tmp'), { recursive: true });
  await fsp.writeFile(path.join(root, 'longhorn-disk.cfg'), JSON.stringify({ diskUUID: DISK_UUID }));
  await fsp.writeFile(victimFile, 'victim file: must never be read, changed or removed\n');
  await fsp.mkdir(path.join(victimEntry, 'inner'), { recursive: true });
  await fsp.writeFile(path.join(victimEntry, 'backing'), 'victim entry\n');
  await fsp.writeFile(path.join(victimEntry, 'inner', 'data'), 'victim data\n');
  await fsp.mkdir(victimDir, { recursive: true });
  await fsp.writeFile(path.join(victimDir, 'backing'), Buffer.alloc(4096, 7));
  await fsp.mkdir(path.join(prefixSibling, 'backing-images', 'img-x'), { recursive: true });
  await fsp.writeFile(path.join(prefixSibling, 'backing-images', 'img-x', 'backing'), 'prefix sibling\n');
  await fsp.symlink(victimDir, path.join(root, 'backing-images', 'evil-x'));
  await fsp.symlink(victimFile, path.join(root, 'tmp', 'lnk-x'));
  await fsp.mkdir(path.join(root, 'backing-images', 'file-x'));
  await fsp.symlink(path.join(victimDir, 'backing'), path.join(root, 'backing-images', 'file-x', 'backing'));
  await fsp.symlink('../..', path.join(root, 'backing-images', 'up-x'));
  await fsp.symlink('../tmp/lnk-x', path.join(root, 'backing-images', 'lnk-x')); // a chain: in the disk, then out
  return { base, root, victimFile, victimEntry, victimDir, prefixSibling, remove: () => fsp.rm(base, { recursive: true, force: true }) };
}

/** One entry of a tree listing: type, size, mtime (ns), and a link's target. */
export type TreeListing = Record<string, string>;

/**
 * Lists `dir` recursively without following links (lstat): `relative path → type size mtime [-> target]`. Entries
 * under `skip` (the disk root) are left out, so two listings differ only if something outside it changed.
 */
export async function listTree(dir: string, skip?: string): Promise<TreeListing> {
  const out: TreeListing = {};
  const walk = async (d: string): Promise<void> => {
    for (const e of await fsp.readdir(d)) {
      const p = path.join(d, e);
      if (skip !== undefined && p === skip) continue;
      const st = await fsp.lstat(p, { bigint: true });
      const type = st.isSymbolicLink() ? 'link' : st.isDirectory() ? 'dir' : st.isFile() ? 'file' : 'other';
      out[path.relative(dir, p)] =
        `${type} ${st.isDirectory() ? '-' : st.size} ${st.mtimeNs}` + (type === 'link' ? ` -> ${await fsp.readlink(p)}` : '');
      if (type === 'dir') await walk(p);
    }
  };
  await walk(dir);
  return out;
}

/** Everything outside the sandbox's disk root, plus the links planted inside it (which must survive too). */
export async function snapshotOutside(s: Sandbox): Promise<TreeListing> {
  const outside = await listTree(s.base, s.root);
  for (const rel of ['backing-images/evil-x', 'tmp/lnk-x', 'backing-images/file-x/backing', 'backing-images/up-x', 'backing-images/lnk-x']) {
    const st = await fsp.lstat(path.join(s.root, rel)).catch(() => undefined);
    outside[`disk/${rel} (planted)`] = st?.isSymbolicLink() ? 'link' : st ? 'not a link' : 'missing';
  }
  return outside;
}

/** How a surface should see a case. */
export interface TraversalCase {
  label: string;
  /** For APIs taking a name and a uuid (gRPC, the data source's `--name`/`--uuid`, clone's `backing-image`). */
  name: string;
  uuid: string;
  /** The sync API's `file-path` value as it goes on the wire, already percent-encoded (query and `{id}`). */
  filePathWire: string;
  /** The parameter the refusal must name on the name/uuid surfaces (`name` or `uuid`). */
  names: 'name' | 'uuid';
  /**
   * The file path is a well-formed path of the layout, refused only because it does not match the uuid given with it:
   * as a `/v1/files/{id}` (no uuid) it is a file that does not exist (404), not a refusal.
   */
  wellFormedId?: true;
}

const enc = (s: string) => encodeURIComponent(s);

/**
 * The traversal attempts (more than 25). Each has a name/uuid form and a file-path form; all must be refused with an
 * error naming the parameter, and leave everything outside the disk root untouched.
 */
export function traversalCases(s: Sandbox): TraversalCase[] {
  const r = s.root;
  const b = `${r}/backing-images`;
  const rel = path.relative(r + '/backing-images', s.base); // "../.."
  const victimName = path.basename(s.victimEntry).replace(/-x$/, ''); // "victim"
  const list: TraversalCase[] = [
    { label: 'relative .. (the reported Delete)', name: `${rel}/${victimName}`, uuid: 'x', filePathWire: enc(`${b}/../../victim-x/backing`), names: 'name' },
    { label: 'many .. to an absolute place', name: `../../../../../${s.base.slice(1)}/${victimName}`, uuid: 'x', filePathWire: enc(`${b}/../../../../../../${s.base.slice(1)}/victim-x/backing`), names: 'name' }, // test-isolation: attack string, sent to the API and never read
    { label: 'absolute path outside the disk', name: s.victimFile, uuid: 'x', filePathWire: enc(s.victimFile), names: 'name' },
    { label: 'absolute new file outside the disk', name: `${s.base}/created`, uuid: 'x', filePathWire: enc(`${s.base}/created-x`), names: 'name' },
    { label: 'URL-encoded dots', name: '%2e%2e%2f%2e%2e%2fvictim', uuid: 'x', filePathWire: `${enc(b)}%2F%2e%2e%2F%2e%2e%2Fvictim-x%2Fbacking`, names: 'name' },
    { label: 'double-encoded dots and slashes', name: '%252e%252e%252fvictim', uuid: 'x', filePathWire: `${enc(b)}%252F%252e%252e%252F%252e%252e%252Fvictim-x%252Fbacking`, names: 'name' },
    { label: 'encoded slash in the name', name: '..%2f..%2fvictim', uuid: 'x', filePathWire: `${enc(b)}%2F..%252F..%252Fvictim-x%2Fbacking`, names: 'name' },
    { label: 'NUL byte', name: 'img\0/../../victim', uuid: 'x', filePathWire: `${enc(b)}%2Fimg-x%2Fbacking%00%2F..%2F..%2F..%2Fvictim.txt`, names: 'name' },
    { label: 'NUL byte at the end', name: 'img\0', uuid: 'x', filePathWire: `${enc(`${b}/img-x/backing`)}%00`, names: 'name' },
    { label: 'overlong name', name: 'a'.repeat(300), uuid: 'x', filePathWire: enc(`${b}/${'a'.repeat(300)}-x/backing`), names: 'name' },
    { label: 'overlong path', name: 'ab'.repeat(130), uuid: 'x', filePathWire: enc(`${b}/${'a/'.repeat(2100)}backing`), names: 'name' },
    { label: 'overlong uuid', name: 'img', uuid: 'u'.repeat(100), filePathWire: enc(`${b}/img-${'u'.repeat(100)}/backing`), names: 'uuid' },
    { label: 'upper-case name (name rule)', name: 'IMG', uuid: 'x', filePathWire: enc(`${b}/IMG-x/backing`), names: 'name' },
    { label: 'name starting with a dash', name: '-img', uuid: 'x', filePathWire: enc(`${b}/-img-x/backing`), names: 'name' },
    { label: 'name of one character (name rule)', name: 'a', uuid: 'x', filePathWire: enc(`${b}/a-x/backing`), names: 'name' },
    { label: 'name ..', name: '..', uuid: 'x', filePathWire: enc(`${b}/..-x/backing`), names: 'name' },
    { label: 'name with a backslash', name: '..\\..\\victim', uuid: 'x', filePathWire: enc(`${b}/..\\..\\victim-x/backing`), names: 'name' },
    { label: 'name with a newline', name: 'img\n', uuid: 'x', filePathWire: enc(`${b}/img\n-x/backing`), names: 'name' },
    { label: 'full-width dots and slash', name: '．．／victim', uuid: 'x', filePathWire: enc(`${b}/．．／victim-x/backing`), names: 'name' },
    { label: 'uuid with ..', name: 'img', uuid: '../../../victim', filePathWire: enc(`${b}/img-../../../victim/backing`), names: 'uuid' },
    { label: 'uuid with a slash', name: 'img', uuid: 'x/../../../victim', filePathWire: enc(`${b}/img-x/../../../victim.txt`), names: 'uuid' },
    { label: 'relative file path', name: 'backing-images/img', uuid: 'x', filePathWire: enc('backing-images/img-x/backing'), names: 'name' },
    { label: 'sibling sharing the root prefix', name: `../../../disk-evil/backing-images/img`, uuid: 'x', filePathWire: enc(`${s.prefixSibling}/backing-images/img-x/backing`), names: 'name' },
    { label: 'disk config inside the root (not in the layout)', name: '../longhorn-disk.cfg', uuid: 'x', filePathWire: enc(`${r}/longhorn-disk.cfg`), names: 'name' },
    { label: 'the disk root itself', name: '.', uuid: 'x', filePathWire: enc(r), names: 'name' },
    { label: 'trailing slash and dot segment', name: './img', uuid: 'x', filePathWire: enc(`${b}/./img-x/backing/`), names: 'name' },
    { label: 'uuid not matching the entry', name: 'img', uuid: 'x ', filePathWire: enc(`${b}/img-other/backing`), names: 'uuid', wellFormedId: true },
    { label: 'planted directory link leading out', name: 'evil', uuid: 'x', filePathWire: enc(`${b}/evil-x/backing`), names: 'name' },
    { label: 'planted relative link to ../..', name: 'up', uuid: 'x', filePathWire: enc(`${b}/up-x/backing`), names: 'name' },
    { label: 'planted file link leading out', name: 'file', uuid: 'x', filePathWire: enc(`${b}/file-x/backing`), names: 'name' },
    { label: 'planted link as the data-source file', name: 'lnk', uuid: 'x', filePathWire: enc(`${r}/tmp/lnk-x`), names: 'name' },
  ];
  return list;
}

/** The file path a valid request uses (the positive control every surface also runs). */
export function validBackingFile(s: Sandbox, name = 'good', uuid = 'x'): string {
  return `${s.root}/backing-images/${name}-${uuid}/backing`;
}

/** One HTTP request to 127.0.0.1:`port`; resolves with the status and the body text. */
export function httpRequest(
  port: number,
  method: string,
  requestPath: string,
  body?: Buffer,
  headers: Record<string, string> = {},
): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: requestPath, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, text: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end(body);
  });
}
