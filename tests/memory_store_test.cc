#include "memory_store.h"

#include "store_contract.h"
#include "store_wrapper.h"

INSTANTIATE_TEST_SUITE_P(
    Memory, StoreContractTest,
    testing::Values(StoreContractParam{"memory", [](idem::Clock& clock) {
                                         return idem::NewMemoryStore(clock);
                                       }}),
    [](const testing::TestParamInfo<StoreContractParam>& info) { return info.param.name; });

// The same contract through a replay cache: answering from memory must not
// change one answer the store gives.
INSTANTIATE_TEST_SUITE_P(MemoryCached, StoreContractTest,
                         testing::Values(StoreContractParam{"memory_cached",
                                                            [](idem::Clock& clock) {
                                                              return idem::testing::WithReplayCache(
                                                                  idem::NewMemoryStore(clock),
                                                                  clock);
                                                            },
                                                            /*reads_some_async=*/true}),
                         [](const testing::TestParamInfo<StoreContractParam>& info) {
                           return info.param.name;
                         });
