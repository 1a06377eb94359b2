export { runDatastoreContract, CONTRACT_KINDS, WidgetKind, GadgetKind, type Widget, type Gadget, type ContractHarness, type ContractFactoryOptions, type ContractLimits } from './contract.js';
export { takeEvents, eventually, waitFor } from './watch-helpers.js';
