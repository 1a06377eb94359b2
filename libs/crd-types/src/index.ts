export { type Schema, s } from './schema/model.js';
export { type ValidationIssue, ValidationError } from './schema/errors.js';
export { validateAgainstSchema } from './schema/validate.js';
export { toOpenApi, type OpenApiSchema } from './schema/openapi.js';
export {
  LONGHORN_API_VERSION,
  BackingImageDataSourceType,
  type BackingImageState,
  DataSourceParameter,
} from './enums.js';
export { type ObjectMeta, type Condition } from './meta.js';
export {
  KINDS,
  CHART_CRD_KINDS,
  REPLICA,
  type KindDefinition,
  type BackingImageDiskFileSpec,
  type BackingImageDiskFileStatus,
  type BackingImageStatus,
  BACKING_IMAGE,
  type BackingImage,
  type BackingImageDataSourceStatus,
  type BackingImageDataSource,
  type BackingImageFileInfo,
  type BackingImageManagerStatus,
  type BackingImageManager,
  type BackupBackingImageStatus,
  BACKUP_BACKING_IMAGE,
  type BackupBackingImage,
  type BackupTarget,
  NODE,
  type Node,
  SETTING,
  type Setting,
} from './kinds/index.js';
export { validateObject, assertValidObject } from './validate-object.js';
export { parseExpectedChecksum, checksumProblem, validateChecksumField, normalizeChecksum } from './checksum.js';
export {
  backingImageLabels,
  backingImageManagerLabels,
  backingImageDataSourcePodLabels,
  backupBackingImageLabels,
  replicaBackingImageSelector,
  backingImageManagerName,
  backingImageManagerPodName,
  backingImageDataSourceName,
  backingImageDataSourcePodName,
  backupBackingImageName,
  generateBackingImageUUID,
  exportAttachmentTicketId,
  autoCorrectName,
  backingImageFilePath,
  backingImageConfigPath,
  dataSourceTempFilePath,
  replicaBackingImagePath,
  LabelKey,
  Component,
} from './names.js';
export {
  isSettingName,
  validateSettingValue,
  settingDefaultValue,
  parseSettingValue,
  type SettingDefinition,
  SETTINGS,
  type SettingName,
  SETTING_NAMES,
} from './settings.js';
export {
  withFinalizer,
  defaultExportType,
  defaultCloneEncryption,
  defaultDiskMaps,
  defaultMinNumberOfCopies,
  defaultDataEngine,
  applyBackingImageCreateDefaults,
  applyBackingImageUpdateDefaults,
  applyBackingImageDataSourceDefaults,
  applyBackingImageManagerDefaults,
  applyBackupBackingImageCreateDefaults,
  applyBackupBackingImageUpdateDefaults,
  backupTargetNameForBackupUrl,
} from './defaults.js';
export {
  isLoopbackHost,
  validateDownloadUrl,
  validateBackingImageCreate,
  validateBackingImageUpdate,
  validateBackingImageStatusUpdate,
  validateBackupBackingImageCreate,
  type DownloadUrlPolicy,
  type VolumeForExport,
} from './admission.js';
export { buildCustomResourceDefinition, renderCrdManifests, renderCrdTemplate, CRD_TEMPLATE_FILE, type CustomResourceDefinition } from './crd.js';
