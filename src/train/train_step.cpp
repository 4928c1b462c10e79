#include "train/train_step.h"

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace meshtrain::train {

TrainStepGraph build_train_step(graph::Graph& g, const models::LlamaConfig& model, int64_t batch, int64_t seq_len,
                                const OptimizerConfig& opt, double max_grad_norm, DType dtype,
                                std::optional<DType> compute_dtype, bool split_loss) {
  graph::Builder b(g);
  TrainStepGraph s;
  s.model = models::build_llama(g, model, batch, seq_len, dtype, compute_dtype, split_loss);
  std::vector<std::string> names;
  std::vector<graph::ValueId> params;
  for (const auto& [name, v] : s.model.params) {
    names.push_back(name);
    params.push_back(v);
  }
  const std::vector<graph::ValueId> grads = graph::append_backward(g, s.model.loss, params, &s.gradient_of);
  const graph::Phase saved_phase = g.phase();
  g.set_phase(graph::Phase::optimizer);
  graph::ScopeGuard scope(g, "optimizer");
  s.grad_norm = b.global_norm(grads);
  const graph::ValueId coef = max_grad_norm > 0 ? b.clip_coefficient(s.grad_norm, max_grad_norm) : graph::ValueId{};
  s.lr = g.add_input("lr", {}, DType::f64);
  s.step = g.add_input("step", {}, DType::i64);
  g.add_output(s.model.loss);
  g.add_output(s.grad_norm);
  for (size_t i = 0; i < params.size(); ++i) {
    const graph::ValueInfo info = g.value(params[i]).info;  // a copy: adding inputs moves the value storage
    const DType state = opt.state_dtype == DType::bf16 ? DType::bf16 : info.dtype;
    const graph::ValueId m = g.add_input(names[i] + ".exp_avg", info.shape, state);
    const graph::ValueId v = g.add_input(names[i] + ".exp_avg_sq", info.shape, state);
    s.exp_avg[names[i]] = m;
    s.exp_avg_sq[names[i]] = v;
    const graph::ValueId grad = coef.valid() ? b.scale_by(grads[i], coef) : grads[i];
    const auto updated = b.adamw(params[i], grad, m, v, s.lr, s.step, opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
    for (int k = 0; k < 3; ++k) {
      g.add_output(updated[static_cast<size_t>(k)]);
      s.write_backs.emplace_back(updated[static_cast<size_t>(k)], k == 0 ? params[i] : k == 1 ? m : v);
    }
  }
  g.set_phase(saved_phase);
  return s;
}

parallel::StepRoles step_roles(const TrainStepGraph& sg, bool tensor_parallel) {
  parallel::StepRoles roles;
  for (const auto& [name, v] : sg.model.params) {
    roles.parameters.push_back(v);
    roles.states.emplace_back(sg.exp_avg.at(name), v);
    roles.states.emplace_back(sg.exp_avg_sq.at(name), v);
    if (const auto dim = parallel::llama_tp_dim(name); dim && tensor_parallel) roles.tp_dims[v] = *dim;
  }
  roles.batch_inputs = {sg.model.tokens, sg.model.targets};
  if (tensor_parallel) {
    roles.residual_stream = sg.model.residual;
    roles.block_inputs = sg.model.normed;
    roles.logits = sg.model.logits;
    roles.gradient_of = sg.gradient_of;
  }
  roles.replicated_outputs = {sg.model.loss, sg.grad_norm};
  roles.updates = sg.write_backs;
  return roles;
}

}  // namespace meshtrain::train
