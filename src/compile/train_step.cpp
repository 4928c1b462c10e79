#include "compile/train_step.h"

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace meshtrain::compile {

namespace {

// Microbatch k of K of a [batch, seq] value: rows k, k + K, k + 2K, ...
graph::ValueId microbatch(graph::Builder& b, graph::ValueId v, int64_t k, int64_t micro_batches) {
  const Shape s = b.graph().value(v).info.shape;
  const int64_t rows = s.dim(0) / micro_batches;
  const graph::ValueId strided = b.reshape(v, {rows, micro_batches, s.dim(1)});
  return b.reshape(b.slice(strided, 1, k, 1), {rows, s.dim(1)});
}

}  // namespace

models::LlamaGraph build_forward(graph::Graph& g, const models::LlamaConfig& model, int64_t batch, int64_t seq_len,
                                 const StepOptions& options, const AfterMicrobatch& after_each) {
  const int64_t micro_batches = options.micro_batches;
  MT_CHECK(micro_batches >= 1 && batch % micro_batches == 0,
           "the batch of {} sequences does not split into {} microbatches of equal size", batch, micro_batches);
  const DType compute = options.compute_dtype.value_or(options.dtype);
  if (micro_batches == 1) {
    models::LlamaGraph m = models::build_llama(g, model, batch, seq_len, options.dtype, compute, options.split_loss);
    if (after_each) after_each(0, m);
    return m;
  }
  model.validate();
  MT_CHECK(seq_len > 0, "seq_len {} must be positive", seq_len);
  graph::Builder b(g);
  const auto param_values = models::add_llama_parameters(g, model, options.dtype);
  const graph::ValueId tokens = g.add_input("tokens", {batch, seq_len}, DType::i64);
  const graph::ValueId targets = g.add_input("targets", {batch, seq_len}, DType::i64);
  graph::ValueId count;
  {
    graph::ScopeGuard scope(g, "loss");
    count = b.op("count_valid", {b.reshape(targets, {batch * seq_len})}, {graph::attr::ignore_index(-100)});
  }
  models::LlamaGraph whole;
  graph::ValueId aux_sum;
  for (int64_t k = 0; k < micro_batches; ++k) {
    const models::LlamaGraph m = models::llama_forward(g, model, param_values, microbatch(b, tokens, k, micro_batches),
                                                       microbatch(b, targets, k, micro_batches), count, compute,
                                                       options.split_loss, 1.0 / static_cast<double>(micro_batches));
    if (after_each) after_each(k, m);
    if (m.aux_loss.valid()) aux_sum = aux_sum.valid() ? b.add(aux_sum, m.aux_loss) : m.aux_loss;
    if (k == 0) {
      whole = m;
      continue;
    }
    whole.loss = b.add(whole.loss, m.loss);
    for (size_t l = 0; l < m.expert_load.size(); ++l)
      whole.expert_load[l] = b.add(whole.expert_load[l], m.expert_load[l]);
    for (const auto member : {&models::LlamaGraph::residual, &models::LlamaGraph::normed, &models::LlamaGraph::logits,
                              &models::LlamaGraph::attention_keys})
      (whole.*member).insert((whole.*member).end(), (m.*member).begin(), (m.*member).end());
    whole.param_copies.insert(whole.param_copies.end(), m.param_copies.begin(), m.param_copies.end());
  }
  whole.tokens = tokens;
  whole.targets = targets;
  if (whole.aux_loss.valid()) {  // the microbatches' mean, as the loss weighs them (each microbatch's is its own)
    graph::ScopeGuard scope(g, "loss");
    whole.aux_loss = b.scale(aux_sum, 1.0 / static_cast<double>(micro_batches));
  }
  return whole;
}

TrainStepGraph build_train_step(graph::Graph& g, const models::LlamaConfig& model, int64_t batch, int64_t seq_len,
                                const config::OptimizerConfig& opt, const StepOptions& options) {
  graph::Builder b(g);
  TrainStepGraph s;
  std::vector<std::string> names;
  std::vector<graph::ValueId> params, grads;
  // Each microbatch's backward right after its forward, its gradients summed.
  s.model = build_forward(g, model, batch, seq_len, options, [&](int64_t k, const models::LlamaGraph& m) {
    if (k == 0)
      for (const auto& [name, v] : m.params) {
        names.push_back(name);
        params.push_back(v);
      }
    const std::vector<graph::ValueId> micro_grads = graph::append_backward(g, m.loss, params, &s.gradient_of);
    if (k == 0) {
      grads = micro_grads;
      return;
    }
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = b.add(grads[i], micro_grads[i]);
  });
  const graph::Phase saved_phase = g.phase();
  g.set_phase(graph::Phase::optimizer);
  {
    graph::ScopeGuard scope(g, "optimizer");
    s.grad_norm = b.global_norm(grads);
  }
  append_optimizer(g, names, params, grads, s.grad_norm, opt, options.max_grad_norm, leading_outputs(s), s);
  g.set_phase(saved_phase);
  return s;
}

void append_optimizer(graph::Graph& g, const std::vector<std::string>& names, const std::vector<graph::ValueId>& params,
                      const std::vector<graph::ValueId>& grads, graph::ValueId grad_norm,
                      const config::OptimizerConfig& opt, double max_grad_norm,
                      const std::vector<graph::ValueId>& leading_outputs, TrainStepGraph& s) {
  graph::Builder b(g);
  const graph::Phase saved_phase = g.phase();
  g.set_phase(graph::Phase::optimizer);
  graph::ScopeGuard scope(g, "optimizer");
  const graph::ValueId coef = max_grad_norm > 0 ? b.clip_coefficient(grad_norm, max_grad_norm) : graph::ValueId{};
  s.lr = g.add_input("lr", {}, DType::f64);
  s.step = g.add_input("step", {}, DType::i64);
  for (const graph::ValueId v : leading_outputs) g.add_output(v);
  for (size_t i = 0; i < params.size(); ++i) {
    const graph::ValueInfo info = g.value(params[i]).info;  // a copy: adding inputs moves the value storage
    const DType state = opt.state_dtype == DType::bf16 ? DType::bf16 : info.dtype;
    const graph::ValueId m = g.add_input(names[i] + ".exp_avg", info.shape, state);
    const graph::ValueId v = g.add_input(names[i] + ".exp_avg_sq", info.shape, state);
    s.exp_avg[names[i]] = m;
    s.exp_avg_sq[names[i]] = v;
    const graph::ValueId grad = coef.valid() ? b.scale_by(grads[i], coef) : grads[i];
    s.applied_gradient_of[params[i]] = grad;
    // A step whose gradient norm is not finite leaves the weights and moments as they were.
    const auto updated =
        b.adamw(params[i], grad, m, v, s.lr, s.step, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, grad_norm);
    for (int k = 0; k < 3; ++k) {
      g.add_output(updated[static_cast<size_t>(k)]);
      s.write_backs.emplace_back(updated[static_cast<size_t>(k)], k == 0 ? params[i] : k == 1 ? m : v);
    }
  }
  g.set_phase(saved_phase);
}

std::vector<graph::ValueId> dispatched_values(const models::LlamaGraph& m) {
  std::vector<graph::ValueId> out = m.dispatched_experts;
  for (const auto& [rows, experts] : m.dispatched_rows) out.push_back(rows);
  return out;
}

std::map<graph::ValueId, graph::ValueId> ragged_rows(const models::LlamaGraph& m,
                                                     const std::map<graph::ValueId, graph::ValueId>& gradient_of) {
  std::map<graph::ValueId, graph::ValueId> out;
  for (const auto& [rows, experts] : m.dispatched_rows) {
    out[rows] = experts;
    if (const auto it = gradient_of.find(rows); it != gradient_of.end()) out[it->second] = experts;
  }
  return out;
}

parallel::StepRoles forward_roles(const models::LlamaGraph& m, bool split_activations, bool expert_tp) {
  parallel::StepRoles roles;
  for (const auto& [name, v] : m.params) {
    roles.parameters.push_back(v);
    if (const auto dim = parallel::llama_tp_dim(name, expert_tp); dim && split_activations) roles.tp_dims[v] = *dim;
    if (parallel::llama_is_experts(name)) roles.experts.push_back(v);
  }
  roles.dispatched = dispatched_values(m);
  roles.batch_inputs = {m.tokens, m.targets};
  if (split_activations) {
    roles.residual_stream = m.residual;
    roles.block_inputs = m.normed;
    roles.logits = m.logits;
    roles.attention_keys = m.attention_keys;
  }
  roles.copies = m.param_copies;
  roles.replicated_outputs = {m.loss};
  return roles;
}

std::vector<graph::ValueId> leading_outputs(const TrainStepGraph& sg) {
  std::vector<graph::ValueId> out{sg.model.loss, sg.grad_norm};
  out.insert(out.end(), sg.model.expert_load.begin(), sg.model.expert_load.end());
  if (sg.model.aux_loss.valid()) out.push_back(sg.model.aux_loss);
  return out;
}

parallel::StepRoles step_roles(const TrainStepGraph& sg, bool split_activations, bool reduce_in_compute_dtype,
                               bool expert_tp) {
  parallel::StepRoles roles = forward_roles(sg.model, split_activations, expert_tp);
  for (const auto& [name, v] : sg.model.params) {
    roles.states.emplace_back(sg.exp_avg.at(name), v);
    roles.states.emplace_back(sg.exp_avg_sq.at(name), v);
  }
  roles.gradient_of = sg.gradient_of;
  roles.applied_gradient_of = sg.applied_gradient_of;
  roles.reduce_copies_in_compute_dtype = reduce_in_compute_dtype;
  roles.replicated_outputs = leading_outputs(sg);  // summed over the ranks where they are partial sums
  roles.updates = sg.write_backs;
  return roles;
}

}  // namespace meshtrain::compile
