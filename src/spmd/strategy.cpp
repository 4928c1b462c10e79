#include "spmd/strategy.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "core/name_registry.h"
#include "spmd/strategies/families.h"

namespace meshtrain::spmd {

namespace {

struct Tables {
  NameRegistry<StrategyRule> strategies;
  NameRegistry<LocalizeRule> localize;
};

Tables& tables() {
  static auto* t = [] {
    auto* tab = new Tables;
    const strategies::AddRule add{[tab](const std::string& op, StrategyRule r) {
                                    graph::find_op(op);  // a rule attaches to an op that exists
                                    // Built-in, before any register_strategy_rule: a clash is ours.
                                    const bool added = tab->strategies.add(op, std::move(r));
                                    MT_ASSERT(added, "built-in op '{}' has two strategy rules", op);
                                  },
                                  [tab](const std::string& op, LocalizeRule r) {
                                    graph::find_op(op);
                                    const bool added = tab->localize.add(op, std::move(r));
                                    MT_ASSERT(added, "built-in op '{}' has two localize rules", op);
                                  }};
    for (auto add_family :
         {strategies::add_elementwise_rules, strategies::add_matmul_rules, strategies::add_reduction_rules,
          strategies::add_shape_rules, strategies::add_embedding_rules, strategies::add_attention_rules,
          strategies::add_optimizer_rules, strategies::add_loss_rules, strategies::add_moe_rules})
      add_family(add);
    return tab;
  }();
  return *t;
}
NameRegistry<StrategyRule>& table() { return tables().strategies; }

std::string placements_text(const std::vector<Placement>& ps) {
  std::vector<std::string> s;
  for (const Placement& p : ps) s.push_back(p.to_string());
  return fmt::format("{}", fmt::join(s, ", "));
}

}  // namespace

std::string DimStrategy::to_string() const {
  return fmt::format("{} -> {}", placements_text(inputs), placements_text(outputs));
}

std::vector<DimStrategy> dim_strategies(const StrategyQuery& q) {
  std::vector<DimStrategy> out;
  if (const StrategyRule* rule = table().find(q.op.name)) out = (*rule)(q);
  for (const DimStrategy& s : out)
    MT_CHECK(s.inputs.size() == q.in.size() && s.outputs.size() == q.out.size(),
             "op {}: strategy {} has {} inputs and {} outputs, the node {} and {}", q.op.name, s.to_string(),
             s.inputs.size(), s.outputs.size(), q.in.size(), q.out.size());
  const DimStrategy replicated{std::vector<Placement>(q.out.size()), std::vector<Placement>(q.in.size())};
  if (std::find(out.begin(), out.end(), replicated) == out.end()) out.push_back(replicated);
  return out;
}

bool has_strategy_rule(const std::string& op) { return table().find(op) != nullptr; }

graph::Attrs local_attrs(const LocalNode& node) {
  const LocalizeRule* rule = tables().localize.find(node.op.name);
  return rule ? (*rule)(node) : node.attrs;
}

void register_strategy_rule(const std::string& op, StrategyRule rule) {
  MT_CHECK(static_cast<bool>(rule), "register_strategy_rule: empty rule for op '{}'", op);
  graph::find_op(op);
  MT_CHECK(table().add(op, std::move(rule)), "register_strategy_rule: op '{}' already has a strategy rule", op);
}

}  // namespace meshtrain::spmd
