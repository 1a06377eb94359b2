import { s } from '../schema/model.js';
import { AGE_COLUMN, defineKind, type ObjectOf } from './kind.js';

export const SETTING = defineKind({
  kind: 'Setting',
  listKind: 'SettingList',
  plural: 'settings',
  singular: 'setting',
  shortNames: ['lhs'],
  description: 'Setting holds the value of one system setting; the object is named after the setting.',
  printerColumns: [
    { name: 'Value', type: 'string', jsonPath: '.value', description: 'The value of the setting' },
    { name: 'Applied', type: 'boolean', jsonPath: '.status.applied', description: 'Whether the value is in effect' },
    AGE_COLUMN,
  ],
  root: s.object(
    {
      value: s.string({ description: 'The value of the setting, as a string.' }),
      status: s.object(
        { applied: s.bool({ description: 'The value is in effect.' }) },
        { required: ['applied'], description: 'SettingStatus is the observed state of a setting.' },
      ),
    },
    { required: ['value'] },
  ),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface Setting extends ObjectOf<typeof SETTING> {}
