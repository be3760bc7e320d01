// Ledger's reads and an operator's acts (idem/ledger.h): thin, so that the
// fronts reach records only through the ledger (docs/DESIGN.md §6.3, §8).
#include "idem/ledger.h"

namespace idem {

Result<std::optional<Record>> Ledger::Read(const RecordId& id) { return store_.Get(id); }

bool Ledger::ReadAsync(const RecordId& id, Store::GetDone done) {
  return store_.GetAsync(id, std::move(done));
}

Result<Resolution> Ledger::Resolve(const ResolveRequest& req,
                                   const std::function<Policy(const std::string& tool)>& policy_for,
                                   const Operator& who) {
  return ResolveRecord(store_, clock_, policy_for, req, who);
}

Result<bool> Ledger::Evict(const RecordId& id, const Operator& who,
                           std::optional<Error>* audit_error) {
  return EvictRecord(store_, clock_, id, who, audit_error);
}

Result<std::vector<Attempt>> Ledger::QueryAttempts(const AttemptFilter& filter) {
  return store_.QueryAttempts(filter);
}

Result<std::map<std::string, ToolStats>> Ledger::SummarizeAttempts(const AttemptFilter& filter) {
  return store_.SummarizeAttempts(filter);
}

}  // namespace idem
