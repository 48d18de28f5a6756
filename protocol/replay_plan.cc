#include "protocol/replay_plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace sdc::protocol {

const char* AttributionCapabilityName(AttributionCapability c) {
  switch (c) {
    case AttributionCapability::kAcrossNodes:
      return "across-nodes";
    case AttributionCapability::kAcrossGpus:
      return "across-gpus";
    case AttributionCapability::kDetectOnly:
      return "detect-only";
    case AttributionCapability::kNone:
      return "none";
  }
  return "unknown";
}

Topology::Topology(std::vector<PlanMember> members) : members_(std::move(members)) {
  std::sort(members_.begin(), members_.end(),
            [](const PlanMember& a, const PlanMember& b) { return a.rank < b.rank; });
  std::map<std::string, int> nodes;
  for (const PlanMember& m : members_) nodes.emplace(m.node, 0);
  int next = 0;
  for (auto& [name, index] : nodes) index = next++;
  node_count_ = static_cast<int>(nodes.size());
  domain_.reserve(members_.size());
  if (node_count_ >= 2) {
    for (const PlanMember& m : members_) domain_.push_back(nodes[m.node]);
    domain_count_ = node_count_;
  } else {
    for (size_t i = 0; i < members_.size(); ++i) domain_.push_back(static_cast<int>(i));
    domain_count_ = static_cast<int>(members_.size());
  }
}

AttributionCapability Topology::capability() const {
  if (members_.size() < 2) return AttributionCapability::kNone;
  if (domain_count_ < 3) return AttributionCapability::kDetectOnly;
  return node_count_ >= 3 ? AttributionCapability::kAcrossNodes
                          : AttributionCapability::kAcrossGpus;
}

int Topology::DomainOf(Rank rank) const {
  auto it = std::lower_bound(
      members_.begin(), members_.end(), rank,
      [](const PlanMember& m, Rank r) { return m.rank < r; });
  if (it == members_.end() || it->rank != rank) return -1;
  return domain_[it - members_.begin()];
}

const std::string& Topology::NodeOf(Rank rank) const {
  static const std::string* const kUnknown = new std::string("?");
  auto it = std::lower_bound(
      members_.begin(), members_.end(), rank,
      [](const PlanMember& m, Rank r) { return m.rank < r; });
  if (it == members_.end() || it->rank != rank) return *kUnknown;
  return it->node;
}

std::string Topology::Describe() const {
  std::map<std::string, int> per_node;
  for (const PlanMember& m : members_) ++per_node[m.node];
  int lo = per_node.empty() ? 0 : per_node.begin()->second, hi = lo;
  for (auto& [node, n] : per_node) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  if (lo == hi) return absl::StrCat(node_count_, " node(s) x ", lo, " GPU(s)");
  return absl::StrCat(members_.size(), " GPUs on ", node_count_, " nodes (", lo,
                      " to ", hi, " per node)");
}

namespace {

std::string CapabilityNote(const Topology& t) {
  switch (t.capability()) {
    case AttributionCapability::kAcrossNodes:
      return "";
    case AttributionCapability::kAcrossGpus:
      return "single node: replay partners are other GPUs of the same node, "
             "so a fault common to the whole node cannot be seen";
    case AttributionCapability::kDetectOnly:
      return absl::StrCat("attribution needs 3 failure domains and this group has ",
                          t.domain_count(), " (", t.Describe(),
                          "): mismatches are detected but nobody can be named");
    case AttributionCapability::kNone:
      return "a single rank has no replay partner";
  }
  return "";
}

}  // namespace

namespace {

// A pseudo-random sequence defined here, not by a standard library (whose
// distributions differ between implementations): every rank and the
// coordinator must derive the very same plan.
class PlanRandom {
 public:
  explicit PlanRandom(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Fisher-Yates.
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Next() % i]);
  }

 private:
  uint64_t state_;
};

}  // namespace

ReplayPlan PlanFullAudit(const Topology& topology, uint64_t audit_index) {
  ReplayPlan plan;
  plan.capability = topology.capability();
  plan.note = CapabilityNote(topology);
  const size_t n = topology.size();
  if (n < 2) return plan;

  // Members grouped by domain. Each audit shuffles the order of the domains
  // and of the ranks inside each (seeded by the audit index), so partners
  // change from audit to audit.
  PlanRandom random(0x5344432d706c616eull ^ (audit_index * 0x2545f4914f6cdd1dull));
  std::vector<std::vector<Rank>> domains(topology.domain_count());
  for (const PlanMember& m : topology.members()) {
    domains[topology.DomainOf(m.rank)].push_back(m.rank);
  }
  random.Shuffle(domains);
  std::vector<Rank> order;
  order.reserve(n);
  size_t largest = 0;
  for (auto& d : domains) {
    largest = std::max(largest, d.size());
    random.Shuffle(d);
    order.insert(order.end(), d.begin(), d.end());
  }

  // Each domain is a contiguous block of `order`, so replaying the member
  // `shift` places ahead crosses domains whenever largest <= shift <= n -
  // largest. shift == n/2 makes every pair mutual; skip it when any other
  // shift exists.
  size_t shift;
  if (2 * largest <= n) {
    const size_t count = n - 2 * largest + 1;  // Shifts largest .. n-largest.
    const bool skip_half = n % 2 == 0 && count > 1;
    shift = largest + random.Next() % (count - (skip_half ? 1 : 0));
    if (skip_half && 2 * shift >= n) ++shift;
  } else {
    // One domain holds more than half the ranks: some pairs must stay in it.
    shift = n - largest;
    plan.cross_domain = false;
    if (plan.note.empty()) {
      plan.note = absl::StrCat("one node holds ", largest, " of ", n,
                               " ranks: some replay partners share a node");
    }
  }
  plan.assignments.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    plan.assignments.push_back({order[i], order[(i + shift) % n]});
  }
  std::sort(plan.assignments.begin(), plan.assignments.end(),
            [](const Assignment& a, const Assignment& b) { return a.replayer < b.replayer; });
  return plan;
}

namespace {

// Members outside the given domains, in rank order.
std::vector<Rank> MembersOutside(const Topology& t, std::initializer_list<int> domains) {
  std::vector<Rank> out;
  for (const PlanMember& m : t.members()) {
    const int d = t.DomainOf(m.rank);
    if (std::find(domains.begin(), domains.end(), d) == domains.end()) {
      out.push_back(m.rank);
    }
  }
  return out;
}

}  // namespace

bool IsScheduledAuditStep(Step step, uint32_t audit_every) {
  return audit_every > 0 && step % audit_every == 0;
}

std::optional<ReplayPlan> ScheduledAudit(Step step, uint32_t audit_every,
                                         const Topology& topology) {
  if (!IsScheduledAuditStep(step, audit_every)) return std::nullopt;
  return PlanFullAudit(topology, step / audit_every);
}

ReplayPlan PlanTargetedAudit(const Topology& topology, Rank suspect,
                             uint64_t audit_index) {
  ReplayPlan plan;
  plan.capability = topology.capability();
  plan.note = CapabilityNote(topology);
  const std::vector<Rank> others = MembersOutside(topology, {topology.DomainOf(suspect)});
  if (others.empty()) return plan;
  // k replays the suspect's batch; the suspect replays i's. Distinct k and i
  // give the suspect two independent comparisons.
  const Rank k = others[audit_index % others.size()];
  const Rank i = others[(audit_index + 1) % others.size()];
  plan.assignments.push_back({k, suspect});
  plan.assignments.push_back({suspect, i});
  std::sort(plan.assignments.begin(), plan.assignments.end(),
            [](const Assignment& a, const Assignment& b) { return a.replayer < b.replayer; });
  return plan;
}

ReplayPlan PlanWatch(const Topology& topology, const std::vector<Rank>& watched, uint64_t salt) {
  ReplayPlan plan;
  plan.capability = topology.capability();
  plan.note = CapabilityNote(topology);
  std::set<Rank> busy(watched.begin(), watched.end());
  for (Rank w : watched) {
    std::vector<Rank> free;
    for (Rank r : MembersOutside(topology, {topology.DomainOf(w)})) {
      if (busy.count(r) == 0) free.push_back(r);
    }
    if (free.empty()) continue;
    const Rank k = free[(salt + w) % free.size()];
    busy.insert(k);
    plan.assignments.push_back({k, w});
  }
  std::sort(plan.assignments.begin(), plan.assignments.end(),
            [](const Assignment& a, const Assignment& b) { return a.replayer < b.replayer; });
  return plan;
}

std::optional<Rank> ChooseTieBreaker(const Topology& topology, Rank a, Rank b,
                                     uint64_t salt) {
  const std::vector<Rank> third =
      MembersOutside(topology, {topology.DomainOf(a), topology.DomainOf(b)});
  if (third.empty()) return std::nullopt;
  return third[salt % third.size()];
}

std::optional<Rank> ChooseConfirmer(const Topology& topology, Rank subject,
                                    uint64_t salt) {
  const std::vector<Rank> others = MembersOutside(topology, {topology.DomainOf(subject)});
  if (others.empty()) return std::nullopt;
  return others[salt % others.size()];
}

}  // namespace sdc::protocol
