#include "memory_store.h"
#include "store_contract.h"

INSTANTIATE_TEST_SUITE_P(
    Memory, StoreContractTest,
    testing::Values(StoreContractParam{"memory", [](idem::Clock& clock) {
                                         return idem::NewMemoryStore(clock);
                                       }}),
    [](const testing::TestParamInfo<StoreContractParam>& info) { return info.param.name; });
