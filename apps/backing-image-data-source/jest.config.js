import base from '../../jest.base.js';

export default { ...base, displayName: 'backing-image-data-source' };
