import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from '@jest/globals';
import { parse } from 'yaml';
import { buildCustomResourceDefinition, CRD_TEMPLATE_FILE, renderCrdManifests, renderCrdTemplate, type CustomResourceDefinition } from './crd.js';
import { CHART_CRD_KINDS, KINDS, REPLICA } from './kinds/index.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const chartDir = join(repoRoot, 'charts/backing-image-system');

function rendered(kind: string): CustomResourceDefinition {
  const def = KINDS.find((k) => k.kind === kind)!;
  return buildCustomResourceDefinition(def);
}

describe('committed CRD template', () => {
  it('is exactly what the schema model renders (run `npx nx run @bis/crd-types:generate` if this fails)', () => {
    const committed = readFileSync(join(chartDir, CRD_TEMPLATE_FILE), 'utf8');
    if (committed !== renderCrdTemplate()) {
      throw new Error(`charts/backing-image-system/${CRD_TEMPLATE_FILE} is out of date: run \`npx nx run @bis/crd-types:generate\``);
    }
    // Helm installs crds/ once and never upgrades it: the chart has no such directory.
    expect(existsSync(join(chartDir, 'crds'))).toBe(false);
  });

  it('rendering is deterministic and parses back to the CRD objects', () => {
    const a = renderCrdManifests();
    const b = renderCrdManifests();
    expect([...a.entries()]).toEqual([...b.entries()]);
    expect(renderCrdTemplate()).toBe(renderCrdTemplate());
    for (const def of CHART_CRD_KINDS) {
      const text = a.get(`${def.singular}.yaml`)!;
      expect(parse(text)).toEqual(buildCustomResourceDefinition(def));
    }
  });

  it("ships Longhorn's Replica CRD: the fields the controllers read, the rest left open", () => {
    const crd = buildCustomResourceDefinition(REPLICA);
    expect(crd.metadata.name).toBe('replicas.longhorn.io');
    expect(crd.spec.names).toEqual({ kind: 'Replica', listKind: 'ReplicaList', plural: 'replicas', shortNames: ['lhr'], singular: 'replica' });
    const v = crd.spec.versions[0]!;
    expect([v.name, v.served, v.storage]).toEqual(['v1beta2', true, true]);
    expect(v.subresources).toEqual({ status: {} });
    const props = v.schema.openAPIV3Schema.properties!;
    const spec = props['spec']!;
    expect(spec['x-kubernetes-preserve-unknown-fields']).toBe(true);
    expect(Object.keys(spec.properties!).sort()).toEqual(['backingImage', 'dataEngine', 'diskID', 'nodeID']);
    for (const k of ['backingImage', 'nodeID', 'diskID']) expect(spec.properties![k]!.type).toBe('string');
    expect(props['status']!['x-kubernetes-preserve-unknown-fields']).toBe(true);
    expect(CHART_CRD_KINDS.map((k) => k.kind)).toEqual([...KINDS.map((k) => k.kind), 'Replica']);
    expect(KINDS.map((k) => k.kind)).not.toContain('Replica');
  });
});

describe('CRD objects', () => {
  it.each(KINDS.map((k) => [k.kind, k] as const))('%s: longhorn.io, v1beta2 served+storage, namespaced, status subresource, labels', (_k, def) => {
    const crd = buildCustomResourceDefinition(def);
    expect(crd.apiVersion).toBe('apiextensions.k8s.io/v1');
    expect(crd.metadata.name).toBe(`${def.plural}.longhorn.io`);
    expect(crd.metadata.labels).toEqual({ 'longhorn-manager': '', 'app.kubernetes.io/name': 'backing-image-system' });
    expect(crd.spec.group).toBe('longhorn.io');
    expect(crd.spec.scope).toBe('Namespaced');
    expect(crd.spec.versions).toHaveLength(1);
    const v = crd.spec.versions[0]!;
    expect([v.name, v.served, v.storage]).toEqual(['v1beta2', true, true]);
    expect(v.subresources).toEqual({ status: {} });
    expect(Object.keys(v.schema.openAPIV3Schema.properties!)).toEqual(expect.arrayContaining(['apiVersion', 'kind', 'metadata']));
    expect(v.schema.openAPIV3Schema.properties!['metadata']).toEqual({ type: 'object' });
  });

  it('short names', () => {
    expect(Object.fromEntries(KINDS.map((k) => [k.kind, buildCustomResourceDefinition(k).spec.names.shortNames]))).toEqual({
      BackingImage: ['lhbi'],
      BackingImageDataSource: ['lhbids'],
      BackingImageManager: ['lhbim'],
      BackupBackingImage: ['lhbbi'],
      Setting: ['lhs'],
      Node: ['lhn'],
      BackupTarget: ['lhbt'],
    });
  });

  it('printer columns as Longhorn has them', () => {
    const cols = (kind: string) =>
      rendered(kind).spec.versions[0]!.additionalPrinterColumns.map((c) => `${c.name} ${c.jsonPath} ${c.type}`);
    expect(cols('BackingImage')).toEqual([
      'UUID .status.uuid string',
      'SourceType .spec.sourceType string',
      'Size .status.size string',
      'VirtualSize .status.virtualSize string',
      'Age .metadata.creationTimestamp date',
    ]);
    expect(cols('BackingImageDataSource')).toEqual([
      'UUID .spec.uuid string',
      'State .status.currentState string',
      'SourceType .spec.sourceType string',
      'Size .status.size string',
      'Node .spec.nodeID string',
      'DiskUUID .spec.diskUUID string',
      'Age .metadata.creationTimestamp date',
    ]);
    expect(cols('BackingImageManager')).toEqual([
      'State .status.currentState string',
      'Image .spec.image string',
      'Node .spec.nodeID string',
      'DiskUUID .spec.diskUUID string',
      'DiskPath .spec.diskPath string',
      'Age .metadata.creationTimestamp date',
    ]);
    // no Age column on BackupBackingImage
    expect(cols('BackupBackingImage')).toEqual([
      'BackingImage .status.backingImage string',
      'Size .status.size string',
      'BackupCreatedAt .status.backupCreatedAt string',
      'State .status.state string',
      'LastSyncedAt .status.lastSyncedAt string',
    ]);
    expect(cols('BackupTarget')).toEqual([
      'URL .spec.backupTargetURL string',
      'Credential .spec.credentialSecret string',
      'LastBackupAt .spec.pollInterval string',
      'Available .status.available boolean',
      'LastSyncedAt .status.lastSyncedAt string',
    ]);
    expect(cols('Setting')).toEqual(['Value .value string', 'Applied .status.applied boolean', 'Age .metadata.creationTimestamp date']);
    expect(cols('Node')[1]).toBe('AllowScheduling .spec.allowScheduling boolean');
  });

  it('schema details Longhorn relies on', () => {
    const bi = rendered('BackingImage').spec.versions[0]!.schema.openAPIV3Schema;
    const spec = bi.properties!['spec']!;
    expect(spec.properties!['sourceType']!.enum).toEqual(['download', 'upload', 'export-from-volume', 'restore', 'clone']);
    expect(spec.properties!['dataEngine']).toMatchObject({ default: 'v1', enum: ['v1', 'v2'], type: 'string' });
    expect(spec.properties!['minNumberOfCopies']).toEqual({ description: expect.any(String), type: 'integer' });
    expect(bi.properties!['status']!.properties!['size']).toMatchObject({ format: 'int64', type: 'integer' });
    expect(bi.properties!['status']!.properties!['diskFileStatusMap']).toMatchObject({ nullable: true, type: 'object' });
    // file states are plain strings in the CRD
    expect(bi.properties!['status']!.properties!['diskFileStatusMap']!.additionalProperties!.properties!['state']).toEqual({ type: 'string' });
    const bbi = rendered('BackupBackingImage').spec.versions[0]!.schema.openAPIV3Schema;
    expect(bbi.properties!['spec']!.required).toEqual(['backingImage', 'userCreated']);
    const setting = rendered('Setting').spec.versions[0]!.schema.openAPIV3Schema;
    expect(setting.required).toEqual(['value']);
  });
});
