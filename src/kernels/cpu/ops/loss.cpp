// CPU kernels of the loss ops (graph/ops/loss.cpp): the loss accumulates in double.
#include <cmath>
#include <limits>

#include "kernels/cpu/kernel_support.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

namespace {

// 1 / the whole batch's count of valid targets (input `k`): a part of the
// rows' sum times it is that part's share of the mean.
double per_token(const KernelArgs& a, size_t k) {
  const double count = a.in[k]->get(0);
  return count > 0 ? 1.0 / count : 0.0;
}

void check_target(int64_t t, int64_t row, int64_t ignore, int64_t vocab) {
  MT_CHECK(t == ignore || (t >= 0 && t < vocab), "cross_entropy: target {} of row {} is outside the vocabulary [0, {})",
           t, row, vocab);
}

// The split loss's kernels (graph/ops/loss.cpp): rows of logits, one value per row.
void add_split_loss_kernels(const AddKernel& add) {
  add("row_max", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* x = in_ptr<T>(a, 0);
      Acc<T>* out = out_ptr<Acc<T>>(a);
      for (int64_t r = 0; r < rows; ++r) {
        Acc<T> m = -std::numeric_limits<Acc<T>>::infinity();
        for (int64_t v = 0; v < vocab; ++v) m = std::max(m, load(x[r * vocab + v]));
        out[r] = m;
      }
    });
  });
  add("sum_exp", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* x = in_ptr<T>(a, 0);
      const Acc<T>* shift = in_ptr<Acc<T>>(a, 1);
      Acc<T>* out = out_ptr<Acc<T>>(a);
      for (int64_t r = 0; r < rows; ++r) {
        Acc<T> total = 0;
        for (int64_t v = 0; v < vocab; ++v) total += exp_of(load(x[r * vocab + v]) - shift[r]);
        out[r] = total;
      }
    });
  });
  add("pick", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    const TablePart part = table_part(a, vocab);
    const int64_t ignore = a.attrs.get(attr::ignore_index);
    const int64_t* targets = in_ptr<int64_t>(a, 1);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* x = in_ptr<T>(a, 0);
      Acc<T>* out = out_ptr<Acc<T>>(a);
      for (int64_t r = 0; r < rows; ++r) {
        check_target(targets[r], r, ignore, part.total);
        const int64_t v = targets[r] - part.start;  // another part's target: 0 here
        out[r] = targets[r] != ignore && v >= 0 && v < vocab ? load(x[r * vocab + v]) : Acc<T>(0);
      }
    });
  });
  add("nll_mean", [](const KernelArgs& a) {  // logits (unread), sum_exp, shift, target logit, targets, count
    const int64_t ignore = a.attrs.get(attr::ignore_index), rows = a.in[1]->numel();
    const int64_t* targets = in_ptr<int64_t>(a, 4);
    double total = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (targets[r] != ignore) total += std::log(a.in[1]->get(r)) + a.in[2]->get(r) - a.in[3]->get(r);
    a.out[0]->set(0, total * per_token(a, 5));
  });
  add("split_loss_backward", [](const KernelArgs& a) {  // logits, targets, shift, sum_exp, dloss, count
    const auto [rows, vocab] = rows_of(*a.in[0]);
    const int64_t start = table_part(a, vocab).start, ignore = a.attrs.get(attr::ignore_index);
    const int64_t* targets = in_ptr<int64_t>(a, 1);
    const double scale = a.in[4]->get(0) * per_token(a, 5);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* x = in_ptr<T>(a, 0);
      const Acc<T>*shift = in_ptr<Acc<T>>(a, 2), *sum_exp = in_ptr<Acc<T>>(a, 3);
      T* dx = out_ptr<T>(a);
      for (int64_t r = 0; r < rows; ++r) {
        T* dr = dx + r * vocab;
        if (targets[r] == ignore) {
          std::fill(dr, dr + vocab, store<T>(0.0));
          continue;
        }
        const auto g = static_cast<Acc<T>>(scale);
        for (int64_t v = 0; v < vocab; ++v)
          dr[v] = store<T>(exp_of(load(x[r * vocab + v]) - shift[r]) / sum_exp[r] * g);
        if (const int64_t t = targets[r] - start; t >= 0 && t < vocab)  // this part holds the target
          dr[t] = store<T>(load(dr[t]) - g);
      }
    });
  });
}

}  // namespace

void add_loss_kernels(const AddKernel& add) {
  add_split_loss_kernels(add);
  add("count_valid", [](const KernelArgs& a) {
    const int64_t ignore = a.attrs.get(attr::ignore_index), n = a.in[0]->numel();
    const int64_t* targets = in_ptr<int64_t>(a, 0);
    int64_t counted = 0;
    for (int64_t i = 0; i < n; ++i) counted += targets[i] != ignore;
    a.out[0]->set(0, static_cast<double>(counted));
  });
  add("cross_entropy", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      *out_ptr<Acc<T>>(a) = static_cast<Acc<T>>(
          cross_entropy(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), rows, vocab, a.attrs.get(attr::ignore_index)) *
          per_token(a, 2));
    });
  });
  add("cross_entropy_backward", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cross_entropy_backward(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), *in_ptr<Acc<T>>(a, 2) * per_token(a, 3),
                             out_ptr<T>(a), rows, vocab, a.attrs.get(attr::ignore_index));
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
