import { issue, ValidationError, type ValidationIssue } from './schema/errors.js';

export type SettingCategory = 'general' | 'backup' | 'danger zone' | 'system info' | 'scheduling';

interface SettingBase {
  readonly displayName: string;
  readonly description: string;
  readonly category: SettingCategory;
  /** Read-only settings are written by the system only (e.g. at manager start). */
  readonly readOnly: boolean;
  /** A required setting may not be set to the empty string. */
  readonly required: boolean;
}
export interface IntSettingDefinition extends SettingBase {
  readonly type: 'int';
  readonly default: number;
  readonly min?: number;
  readonly max?: number;
  /** Unit of the value, for display (e.g. minutes, seconds). */
  readonly unit?: string;
}
export interface BoolSettingDefinition extends SettingBase {
  readonly type: 'bool';
  readonly default: boolean;
}
export interface StringSettingDefinition extends SettingBase {
  readonly type: 'string';
  readonly default: string;
  /** When set, the value must be one of these. */
  readonly options?: readonly string[];
}
/** Longhorn's "deprecated" type: a free string with no static default, kept for compatibility. */
export interface DeprecatedSettingDefinition extends SettingBase {
  readonly type: 'deprecated';
  readonly default: '';
}
export type SettingDefinition =
  | IntSettingDefinition
  | BoolSettingDefinition
  | StringSettingDefinition
  | DeprecatedSettingDefinition;

function def<const D extends SettingDefinition>(d: D): D {
  return d;
}

/** The settings relevant to backing images (control plane §1.8), keyed by their Setting CR name. */
export const SETTINGS = {
  'default-backing-image-manager-image': def({
    type: 'deprecated',
    displayName: 'Default Backing Image Manager Image',
    description: 'Image of the backing image managers. Written at each controller start from its command line; read-only.',
    category: 'system info',
    readOnly: true,
    required: true,
    default: '',
  }),
  'backing-image-cleanup-wait-interval': def({
    type: 'int',
    displayName: 'Backing Image Cleanup Wait Interval',
    description: 'Minutes an unused backing image copy is kept on a disk before it may be removed.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 60,
    min: 0,
    unit: 'minutes',
  }),
  'backing-image-recovery-wait-interval': def({
    type: 'int',
    displayName: 'Backing Image Recovery Wait Interval',
    description: 'Seconds to wait before re-downloading a backing image whose copies have all failed.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 300,
    min: 0,
    unit: 'seconds',
  }),
  'backing-image-scrub-interval': def({
    type: 'int',
    displayName: 'Backing Image Scrub Interval',
    description:
      'Seconds between two background re-verifications of each ready backing image copy against its SHA-512 chain (finds bit rot that leaves the mtime unchanged); 0 turns the scrub off. Applied when a backing image manager starts.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 7 * 24 * 3600,
    min: 0,
    unit: 'seconds',
  }),
  'backing-image-scrub-bandwidth': def({
    type: 'int',
    displayName: 'Backing Image Scrub Bandwidth',
    description: 'Bytes per second the scrub reads on each disk (default 50 MiB/s). Applied when a backing image manager starts.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 50 * 1024 * 1024,
    min: 1,
    unit: 'bytes per second',
  }),
  'default-min-number-of-backing-image-copies': def({
    type: 'int',
    displayName: 'Default Minimum Number of Backing Image Copies',
    description: 'minNumberOfCopies given to a new backing image that does not set it.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 3,
    min: 1,
  }),
  'concurrent-backing-image-replenish-per-node-limit': def({
    type: 'int',
    displayName: 'Concurrent Backing Image Replenish Per Node Limit',
    description: 'Most backing image copies being prepared at once on one node; 0 disables replenishment.',
    category: 'danger zone',
    readOnly: false,
    required: true,
    default: 5,
    min: 0,
  }),
  'backup-concurrent-limit': def({
    type: 'int',
    displayName: 'Backup Concurrent Limit',
    description: 'Blocks transferred in parallel by one backup or restore.',
    category: 'backup',
    readOnly: false,
    required: true,
    default: 2,
    min: 1,
  }),
  'backup-compression-method': def({
    type: 'string',
    displayName: 'Backup Compression Method',
    description: 'Compression of backup blocks.',
    category: 'backup',
    readOnly: false,
    required: true,
    default: 'lz4',
    options: ['none', 'lz4', 'gzip'],
  }),
  'storage-network': def({
    type: 'string',
    displayName: 'Storage Network',
    description: 'Multus network (namespace/name) for data traffic; empty uses the cluster network.',
    category: 'danger zone',
    readOnly: false,
    required: false,
    default: '',
  }),
  'taint-toleration': def({
    type: 'string',
    displayName: 'Kubernetes Taint Toleration',
    description: 'Tolerations of system-managed pods, `key=value:effect` separated by semicolons.',
    category: 'danger zone',
    readOnly: false,
    required: false,
    default: '',
  }),
  'system-managed-components-node-selector': def({
    type: 'string',
    displayName: 'System Managed Components Node Selector',
    description: 'Node selector of system-managed pods, `key=value` separated by semicolons.',
    category: 'danger zone',
    readOnly: false,
    required: false,
    default: '',
  }),
  'priority-class': def({
    type: 'string',
    displayName: 'Priority Class',
    description: 'PriorityClass of system-managed pods.',
    category: 'danger zone',
    readOnly: false,
    required: false,
    default: 'longhorn-critical',
  }),
  'registry-secret': def({
    type: 'string',
    displayName: 'Registry Secret',
    description: 'Image pull secret of system-managed pods.',
    category: 'general',
    readOnly: false,
    required: false,
    default: '',
  }),
  'system-managed-pods-image-pull-policy': def({
    type: 'string',
    displayName: 'System Managed Pod Image Pull Policy',
    description: 'Image pull policy of system-managed pods.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 'if-not-present',
    options: ['if-not-present', 'always', 'never'],
  }),
  'allow-empty-node-selector-volume': def({
    type: 'bool',
    displayName: 'Allow Scheduling Empty Node Selector Volumes To Any Node',
    description: 'A backing image without a node selector may be placed on nodes that have tags.',
    category: 'scheduling',
    readOnly: false,
    required: true,
    default: true,
  }),
  'allow-empty-disk-selector-volume': def({
    type: 'bool',
    displayName: 'Allow Scheduling Empty Disk Selector Volumes To Any Disk',
    description: 'A backing image without a disk selector may be placed on disks that have tags.',
    category: 'scheduling',
    readOnly: false,
    required: true,
    default: true,
  }),
  'backing-image-max-size': def({
    type: 'int',
    displayName: 'Backing Image Max Size',
    description:
      'Largest backing image, in bytes, a data source stores (after decompression) or accepts as an upload\'s declared size; the free space of the destination disk less its reserve bounds it too.',
    category: 'general',
    readOnly: false,
    required: true,
    default: 2 * 1024 ** 4,
    min: 1,
    unit: 'bytes',
  }),
  'replica-file-sync-http-client-timeout': def({
    type: 'int',
    displayName: 'Timeout of HTTP Client to Replica File Sync Server',
    description: 'Seconds the HTTP client waits when syncing files from a replica (export-from-volume).',
    category: 'danger zone',
    readOnly: false,
    required: true,
    default: 30,
    min: 5,
    max: 120,
    unit: 'seconds',
  }),
  'allow-unauthenticated-internal-calls': def({
    type: 'bool',
    displayName: 'Allow Unauthenticated Internal Calls',
    description:
      'Manager and data-source pods created from now on also admit internal callers that send no token (Longhorn\'s Go components); a caller with a wrong token is still refused. The controller flag --allow-unauthenticated-internal-calls turns it on as well.',
    category: 'danger zone',
    readOnly: false,
    required: true,
    default: false,
  }),
} as const satisfies Record<string, SettingDefinition>;

export type SettingName = keyof typeof SETTINGS;
export const SETTING_NAMES = Object.keys(SETTINGS) as SettingName[];

/** The parsed (typed) value of setting `N`. */
export type SettingValue<N extends SettingName> = (typeof SETTINGS)[N] extends { type: 'int' }
  ? number
  : (typeof SETTINGS)[N] extends { type: 'bool' }
    ? boolean
    : string;

export function isSettingName(name: string): name is SettingName {
  return Object.hasOwn(SETTINGS, name);
}

const INTEGER = /^-?\d+$/;

/**
 * Checks a Setting value (Setting CR `value`, always a string) against its definition: type, range and options.
 * Returns every issue; the path of each is the setting name.
 */
export function validateSettingValue(name: string, value: string): ValidationIssue[] {
  if (!isSettingName(name)) return [issue(name, 'reference', 'is not a known setting')];
  const d: SettingDefinition = SETTINGS[name];
  const out: ValidationIssue[] = [];
  if (value === '') {
    if (d.required) out.push(issue(name, 'required', 'must not be empty'));
    return out;
  }
  switch (d.type) {
    case 'int': {
      const trimmed = value.trim();
      if (!INTEGER.test(trimmed) || !Number.isSafeInteger(Number(trimmed))) {
        out.push(issue(name, 'type', `must be an integer (got ${JSON.stringify(value)})`));
        break;
      }
      const n = Number(trimmed);
      if (d.min !== undefined && n < d.min) out.push(issue(name, 'minimum', `must be >= ${d.min} (got ${n})`));
      if (d.max !== undefined && n > d.max) out.push(issue(name, 'maximum', `must be <= ${d.max} (got ${n})`));
      break;
    }
    case 'bool':
      if (value !== 'true' && value !== 'false') {
        out.push(issue(name, 'type', `must be "true" or "false" (got ${JSON.stringify(value)})`));
      }
      break;
    case 'string':
      if (d.options && !d.options.includes(value)) {
        out.push(issue(name, 'enum', `must be one of ${d.options.map((o) => JSON.stringify(o)).join(', ')} (got ${JSON.stringify(value)})`));
      }
      break;
    case 'deprecated':
      break;
  }
  return out;
}

/** The value of setting `name` as a string when nothing set it (what a new Setting CR holds). */
export function settingDefaultValue(name: SettingName): string {
  return String(SETTINGS[name].default);
}

/**
 * Parses a Setting value into its type. An empty value means "not set": the built-in default is returned.
 * Throws a {@link ValidationError} listing the problems for an invalid value.
 */
export function parseSettingValue<N extends SettingName>(name: N, value: string | undefined): SettingValue<N> {
  const d: SettingDefinition = SETTINGS[name];
  if (value === undefined || (value === '' && d.type !== 'string' && d.type !== 'deprecated')) {
    return d.default as SettingValue<N>;
  }
  const issues = validateSettingValue(name, value);
  if (issues.length > 0) throw new ValidationError(`setting ${name}`, issues);
  switch (d.type) {
    case 'int':
      return Number(value.trim()) as SettingValue<N>;
    case 'bool':
      return (value === 'true') as SettingValue<N>;
    default:
      return value as SettingValue<N>;
  }
}
