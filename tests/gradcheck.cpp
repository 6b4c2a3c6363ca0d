#include "gradcheck.h"

#include <omp.h>

#include <cmath>
#include <sstream>

#include "tensor/random.h"

namespace dtr::testing {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.sizes() == b.sizes(), "max_abs_diff: shapes ", a.sizes(), " vs ", b.sizes());
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

std::string same_bits_on_threads(const std::function<std::vector<Tensor>()>& run, const std::vector<int>& threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> ref = run();
  std::string err;
  for (int t : threads) {
    omp_set_num_threads(t);
    const std::vector<Tensor> got = run();
    for (size_t i = 0; i < ref.size() && err.empty(); ++i)
      if (got.size() != ref.size() || !allclose(got[i], ref[i], 0, 0))
        err = "output " + std::to_string(i) + " on " + std::to_string(t) + " threads differs from 1 thread's";
  }
  omp_set_num_threads(saved);
  return err;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.sizes() != b.sizes()) return false;
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i)
    if (!(std::abs(va[i] - vb[i]) <= atol + rtol * std::abs(vb[i]))) return false;
  return true;
}

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs) {
  Tensor w;
  {
    NoGradGuard ng;
    Tensor probe = f(inputs);
    const GeneratorState saved = generator_state();
    manual_seed(1234);
    w = uniform(probe.sizes(), 0.5, 1.5, TensorOptions(DType::f64));
    set_generator_state(saved);
  }
  auto objective = [&](const std::vector<Tensor>& in) { return sum(mul(f(in), w)); };
  for (auto& t : inputs)
    if (t.requires_grad()) t.set_grad(Tensor());
  objective(inputs).backward();
  std::ostringstream err;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    DTR_CHECK(x.dtype() == DType::f64 && x.is_contiguous(), "gradcheck: inputs must be contiguous f64 leaves");
    Tensor analytic = x.grad().defined() ? x.grad() : zeros_like(x);
    auto va = analytic.to_vector<double>();
    double* p = x.data<double>();
    NoGradGuard ng;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double orig = p[i];
      p[i] = orig + kGradEps;
      const double up = objective(inputs).item<double>();
      p[i] = orig - kGradEps;
      const double down = objective(inputs).item<double>();
      p[i] = orig;
      const double numeric = (up - down) / (2 * kGradEps);
      if (!(std::abs(numeric - va[i]) <= kGradAtol + kGradRtol * std::abs(numeric))) {
        err << "input " << k << " element " << i << ": analytic " << va[i] << " vs numeric " << numeric;
        return err.str();
      }
    }
  }
  return "";
}

Tensor golden_grad_weight(const Shape& shape) {
  std::vector<double> w(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.37 * static_cast<double>(i) + 0.1);
  return from_vector<double>(w, shape);
}

}  // namespace dtr::testing
