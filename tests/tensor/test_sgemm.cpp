// dtr's AVX-512 SGEMM (tensor/ops/cpu/sgemm.h) against a double-accumulated triple loop: edge
// sizes around the 14x32 register tile and the 16-wide skinny paths, all layouts of A and B
// (row-major, column-major, both with padded leading strides, and a non-unit-stride view),
// accumulate on/off, ldc > n, K split into several blocks, k = 0, and bitwise equality of
// results across thread counts. Skipped in builds without AVX-512. The AVX2 twin
// (sgemm_avx2.h) against the same reference: odd shapes around its 6x16 tile, every layout,
// K blocks, accumulate, ldc > n, thread-count independence. gemm.cpp's avx2+eigen dispatch (the
// default without AVX-512; tensor_test_sgemm_avx2_eigen runs it with DTR_SGEMM=avx2+eigen).
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/sgemm.h"
#include "tensor/ops/cpu/sgemm_avx2.h"

using dtr::cpu::sgemm;
using dtr::cpu::sgemm_avx2;

namespace {

enum class Layout { Row, Col, Strided };

/// The kernel under test: sgemm (AVX-512) or sgemm_avx2.
using GemmFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                        float*, int64_t, bool);

/// A rows x cols operand stored in `buf` with element (i, j) at i*rs + j*cs; unused slots are NaN
/// so that reading outside the operand shows up in the result.
struct Operand {
  std::vector<float> buf;
  int64_t rs = 0, cs = 0;
  float at(int64_t i, int64_t j) const { return buf[static_cast<size_t>(i * rs + j * cs)]; }
};

Operand make_operand(int64_t rows, int64_t cols, Layout l, int64_t pad, std::mt19937& g) {
  Operand o;
  size_t size = 0;
  switch (l) {
    case Layout::Row: o.rs = cols + pad; o.cs = 1; size = static_cast<size_t>(rows * o.rs); break;
    case Layout::Col: o.rs = 1; o.cs = rows + pad; size = static_cast<size_t>(cols * o.cs); break;
    case Layout::Strided: o.rs = 2 * cols + 1; o.cs = 2; size = static_cast<size_t>(rows * o.rs); break;
  }
  o.buf.assign(size + 1, std::numeric_limits<float>::quiet_NaN());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) o.buf[static_cast<size_t>(i * o.rs + j * o.cs)] = u(g);
  return o;
}

/// Runs sgemm and checks every element against the double reference with the bound
/// |err| <= (k + 2) * 2^-23 * (sum_p |a_ip||b_pj| + |c0_ij|); checks the ldc padding is untouched.
void check_one(int64_t m, int64_t n, int64_t k, Layout la, Layout lb, bool acc, int64_t ldc_pad, std::mt19937& g,
               GemmFn gemm = sgemm) {
  INFO("m=" << m << " n=" << n << " k=" << k << " A layout " << int(la) << " B layout " << int(lb) << " acc " << acc
            << " ldc pad " << ldc_pad);
  const Operand A = make_operand(m, k, la, 3, g), B = make_operand(k, n, lb, 5, g);
  const int64_t ldc = n + ldc_pad;
  // C starts on a 64-byte boundary, as dtr's large blocks do, so the rows of a large C whose
  // start is aligned take the non-temporal stores (glibc's vector storage is 16 bytes off).
  std::vector<float> cbuf(static_cast<size_t>(m * ldc) + 16);
  float* C = cbuf.data() + (16 - reinterpret_cast<uintptr_t>(cbuf.data()) / sizeof(float) % 16) % 16;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < m * ldc; ++i) C[i] = u(g);
  const std::vector<float> C0(C, C + m * ldc);
  gemm(m, n, k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, C, ldc, acc);
  std::vector<double> ref(static_cast<size_t>(m * n), 0.0), mag(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const double a = A.at(i, p);
      for (int64_t j = 0; j < n; ++j) {
        const double b = B.at(p, j);
        ref[static_cast<size_t>(i * n + j)] += a * b;
        mag[static_cast<size_t>(i * n + j)] += std::fabs(a * b);
      }
    }
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const size_t r = static_cast<size_t>(i * n + j), c = static_cast<size_t>(i * ldc + j);
      const double c0 = acc ? C0[c] : 0.0;
      const double tol = (k + 2) * std::ldexp(1.0, -23) * (mag[r] + std::fabs(c0)) + 1e-30;
      if (!(std::fabs(C[c] - (ref[r] + c0)) <= tol)) ++bad;
    }
    for (int64_t j = n; j < ldc; ++j)
      if (std::memcmp(&C[static_cast<size_t>(i * ldc + j)], &C0[static_cast<size_t>(i * ldc + j)], sizeof(float)))
        ++bad;
  }
  CHECK(bad == 0);
}

/// C = A * B once on 1 thread, then `reps` times back to back on 2 and on 3 threads: every
/// result bitwise equal to the 1-thread one. Leaves the thread count at 3.
void check_same_bits_2_3_threads(GemmFn gemm, int64_t m, int64_t n, int64_t k, const Operand& A, const Operand& B,
                                 int reps) {
  std::vector<float> one(static_cast<size_t>(m * n)), out(one.size());
  omp_set_num_threads(1);
  gemm(m, n, k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, one.data(), n, false);
  for (int t = 2; t <= 3; ++t) {
    omp_set_num_threads(t);
    int wrong = 0;
    for (int rep = 0; rep < reps; ++rep) {
      gemm(m, n, k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, out.data(), n, false);
      wrong += std::memcmp(one.data(), out.data(), one.size() * sizeof(float)) != 0;
    }
    INFO(t << " threads");
    CHECK(wrong == 0);
  }
}

}  // namespace

TEST_CASE("sgemm matches a double reference over edge sizes and layouts", "[sgemm]") {
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::mt19937 g(7);
  const std::vector<int64_t> sizes = {1, 2, 7, 8, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 577};
  const Layout layouts[2] = {Layout::Row, Layout::Col};
  int64_t case_no = 0;
  for (size_t a = 0; a < sizes.size(); ++a)
    for (size_t b = 0; b < sizes.size(); ++b) {
      const int64_t m = sizes[a], n = sizes[b], k = sizes[(a * 7 + b * 3) % sizes.size()];
      if (m * n * k > 4'000'000) continue;
      const int64_t c = case_no++;
      check_one(m, n, k, layouts[c % 2], layouts[(c / 2) % 2], c % 3 == 0, (c % 5 == 0) ? 3 : 0, g);
    }
  // k = 1 and the skinny shapes of LoRA rank 8, every layout pair.
  for (Layout la : layouts)
    for (Layout lb : layouts) {
      check_one(65, 33, 1, la, lb, false, 0, g);
      check_one(100, 8, 577, la, lb, false, 0, g);  // X @ A^T
      check_one(100, 577, 8, la, lb, true, 2, g);   // Z @ B^T
      check_one(8, 577, 100, la, lb, false, 0, g);  // dA = dZ^T @ X
      check_one(577, 8, 100, la, lb, true, 0, g);   // dB = dY^T @ Z
      check_one(33, 65, 1300, la, lb, false, 1, g); // several K blocks
      check_one(31, 16, 700, la, lb, true, 0, g);
    }
  // Neither stride unit (not used by mm, but allowed).
  check_one(29, 45, 37, Layout::Strided, Layout::Strided, true, 0, g);
  check_one(29, 7, 37, Layout::Strided, Layout::Col, false, 0, g);
}

TEST_CASE("sgemm on a layer-sized product, a C past the streaming threshold and small m over K blocks",
          "[sgemm]") {
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::mt19937 g(11);
  check_one(1024, 1536, 576, Layout::Row, Layout::Col, false, 0, g);
  check_one(1024, 4200, 64, Layout::Row, Layout::Col, false, 8, g);  // C 17 MB, rows 64-byte aligned: non-temporal stores
  check_one(8, 1000, 1500, Layout::Row, Layout::Row, true, 0, g);    // small-m path, k > 640
  check_one(1000, 5, 1500, Layout::Col, Layout::Col, false, 0, g);   // the same solved as C^T
  // Dot path with Bt past L1 (k in chunks, lane sums kept between them): LoRA's n = 8 at
  // k = 1536 (3 chunks) with an odd row count and a short last chunk, n = 13 (one row at a time).
  check_one(101, 8, 1537, Layout::Row, Layout::Col, true, 0, g);
  check_one(37, 13, 1100, Layout::Row, Layout::Row, false, 2, g);
  // Tall weight-gradient layout (A column-major, all of B in L2: A panels packed as they are
  // used): a C of 16.8 MB in one K block (non-temporal stores), and an accumulate over 3 blocks.
  check_one(7500, 560, 40, Layout::Col, Layout::Row, false, 0, g);
  check_one(2000, 100, 1300, Layout::Col, Layout::Row, true, 0, g);
}

TEST_CASE("sgemm: a row range of C computed alone has the bits of the whole product", "[sgemm]") {
  // grouped_mm computes a large group as row pieces whose cut depends on the thread count and
  // relies on each piece getting the bits of the whole group's product: the path and K blocking
  // must not depend on m. A C of 17 MB (non-temporal stores when whole, not in halves) at
  // k = 700 (two K blocks) in lm_head's dW layout and in the row-major one, on 2 threads.
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::mt19937 g(29);
  const int64_t m = 4160, n = 1024, k = 700;
  for (const Layout la : {Layout::Col, Layout::Row}) {
    INFO("A layout " << int(la));
    const Operand A = make_operand(m, k, la, 0, g), B = make_operand(k, n, Layout::Row, 0, g);
    std::vector<float> whole(static_cast<size_t>(m * n)), parts(whole.size());
    sgemm(m, n, k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, whole.data(), n, false);
    for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, 1040}, {1040, 3120}, {3120, m}})
      sgemm(r1 - r0, n, k, A.buf.data() + r0 * A.rs, A.rs, A.cs, B.buf.data(), B.rs, B.cs, parts.data() + r0 * n, n,
            false);
    CHECK(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("sgemm propagates NaN and Inf on every path", "[sgemm]") {
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::mt19937 g(13);
  struct Case {
    int64_t m, n, k;
    Layout la, lb;
  };
  // general, skinny dot (n <= 16, A row-major), small m, small n solved as C^T, skinny n.
  const Case cases[] = {{100, 100, 100, Layout::Row, Layout::Col}, {100, 8, 300, Layout::Row, Layout::Col},
                        {4, 300, 100, Layout::Row, Layout::Row},   {300, 8, 100, Layout::Col, Layout::Col},
                        {5, 12, 100, Layout::Col, Layout::Row}};
  for (const Case& c : cases)
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      INFO("m=" << c.m << " n=" << c.n << " k=" << c.k << " value " << bad);
      Operand A = make_operand(c.m, c.k, c.la, 0, g);
      const Operand B = make_operand(c.k, c.n, c.lb, 0, g);
      const int64_t row = c.m / 2;
      A.buf[static_cast<size_t>(row * A.rs + 3 * A.cs)] = bad;
      std::vector<float> C(static_cast<size_t>(c.m * c.n), 0.0f);
      sgemm(c.m, c.n, c.k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, C.data(), c.n, false);
      int64_t wrong = 0;
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          const float x = C[static_cast<size_t>(i * c.n + j)];
          // Inf times a random nonzero b is +-Inf (unless another Inf cancels: there is none).
          if (i == row ? std::isfinite(x) : !std::isfinite(x)) ++wrong;
        }
      CHECK(wrong == 0);
    }
}

TEST_CASE("sgemm with k = 0 zeroes or keeps C", "[sgemm]") {
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::vector<float> C(3 * 5, 2.0f);
  const float dummy = 0.0f;
  sgemm(3, 4, 0, &dummy, 0, 1, &dummy, 4, 1, C.data(), 5, true);
  for (float x : C) CHECK(x == 2.0f);
  sgemm(3, 4, 0, &dummy, 0, 1, &dummy, 4, 1, C.data(), 5, false);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) CHECK(C[static_cast<size_t>(i * 5 + j)] == (j < 4 ? 0.0f : 2.0f));
}

TEST_CASE("sgemm on 2-3 threads with a short last K block matches the reference", "[sgemm]") {
  // k % (number of K blocks) != 0 makes the last block shorter than the others; its packed A
  // panels once started at a different offset and overlapped the previous block's panels of the
  // next thread, which was still reading them (row split, no barrier): wrong results that came
  // and went from run to run (m=130, n=32, k=641 on 2 threads: 126 of 200 back-to-back calls).
  // The race needs the threads running at once, so each case is called 60 times back to back and
  // compared bitwise with the 1-thread result, which is checked against the reference. The last
  // three cases take the row chunks over 10 K blocks (B in L2) and the general path's row and
  // column chunks over two: a chunk of block b + 1 must not add to C tiles another thread is
  // still writing in block b.
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::mt19937 g(11);
  struct Case {
    int64_t m, n, k;
    Layout la, lb;
  };
  const Case cases[] = {{130, 32, 641, Layout::Col, Layout::Row},
                        {300, 64, 1300, Layout::Row, Layout::Row},
                        {2000, 100, 1300, Layout::Col, Layout::Row},   // A panels packed as used
                        {200, 40, 6000, Layout::Row, Layout::Row},     // 10 K blocks, B in L2
                        {300, 2100, 700, Layout::Row, Layout::Col},    // row chunks, 2 column blocks
                        {40, 2100, 700, Layout::Row, Layout::Col}};    // column chunks
  const int saved = omp_get_max_threads();
  for (const Case& c : cases) {
    INFO("m=" << c.m << " n=" << c.n << " k=" << c.k);
    omp_set_num_threads(1);
    check_one(c.m, c.n, c.k, c.la, c.lb, false, 0, g);
    check_same_bits_2_3_threads(sgemm, c.m, c.n, c.k, make_operand(c.m, c.k, c.la, 1, g),
                                make_operand(c.k, c.n, c.lb, 1, g), 60);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("sgemm results do not depend on the thread count", "[sgemm]") {
  if (!dtr::cpu::sgemm_available()) {
    WARN("this build has no AVX-512 SGEMM (f32 GEMM runs on Eigen): nothing to test");
    return;
  }
  std::mt19937 g(3);
  struct Case {
    int64_t m, n, k;
    Layout la, lb;
  };
  // Row split, column split (few row panels or a wide B; several K blocks, A repacked
  // between barriers), skinny n, skinny k, small m, the dot path in k chunks.
  const Case cases[] = {{300, 577, 100, Layout::Row, Layout::Col},  {1000, 33, 200, Layout::Col, Layout::Row},
                        {77, 300, 1500, Layout::Row, Layout::Row},  {1000, 8, 600, Layout::Row, Layout::Col},
                        {1000, 700, 8, Layout::Row, Layout::Col},   {8, 1000, 900, Layout::Col, Layout::Row},
                        {100, 1000, 700, Layout::Col, Layout::Col}, {1000, 8, 1536, Layout::Row, Layout::Col}};
  const int saved = omp_get_max_threads();
  for (const Case& c : cases) {
    INFO("m=" << c.m << " n=" << c.n << " k=" << c.k);
    const Operand A = make_operand(c.m, c.k, c.la, 1, g), B = make_operand(c.k, c.n, c.lb, 1, g);
    std::vector<float> out[3];
    for (int t = 1; t <= 3; ++t) {
      omp_set_num_threads(t);
      out[t - 1].assign(static_cast<size_t>(c.m * c.n), 1.0f);
      sgemm(c.m, c.n, c.k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, out[t - 1].data(), c.n, true);
    }
    CHECK(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(out[0].data(), out[2].data(), out[0].size() * sizeof(float)) == 0);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("sgemm_avx2 matches a double reference over odd shapes and layouts", "[sgemm][avx2]") {
  if (!dtr::cpu::sgemm_avx2_available()) {
    WARN("this build or CPU has no AVX2 + FMA: nothing to test");
    return;
  }
  std::mt19937 g(17);
  // Around the 6x16 tile (5, 6, 7, 15, 16, 17), the 384-deep K block (383, 385, 769) and
  // primes; every layout pair, accumulate and ldc padding alternating.
  const std::vector<int64_t> sizes = {1, 3, 5, 6, 7, 11, 15, 16, 17, 31, 33, 97, 383, 385};
  const Layout layouts[3] = {Layout::Row, Layout::Col, Layout::Strided};
  int64_t case_no = 0;
  for (size_t a = 0; a < sizes.size(); ++a)
    for (size_t b = 0; b < sizes.size(); ++b) {
      const int64_t m = sizes[a], n = sizes[b], k = sizes[(a * 5 + b * 3) % sizes.size()];
      if (m * n * k > 3'000'000) continue;
      const int64_t c = case_no++;
      check_one(m, n, k, layouts[c % 3], layouts[(c / 3) % 3], c % 2 == 0, (c % 4 == 0) ? 3 : 0, g, sgemm_avx2);
    }
  for (Layout la : {Layout::Row, Layout::Col})
    for (Layout lb : {Layout::Row, Layout::Col}) {
      check_one(100, 8, 577, la, lb, false, 0, g, sgemm_avx2);  // LoRA's skinny shapes take the packed path
      check_one(8, 577, 100, la, lb, true, 1, g, sgemm_avx2);
      check_one(37, 45, 769, la, lb, true, 2, g, sgemm_avx2);   // three K blocks
      check_one(29, 1100, 50, la, lb, false, 0, g, sgemm_avx2); // column split (wide B), two 1024-column chunks
    }
  check_one(300, 200, 130, Layout::Row, Layout::Col, false, 0, g, sgemm_avx2);  // the linear layer's layout
}

TEST_CASE("sgemm_avx2 with k = 0 and on 1-3 threads gives the same bits", "[sgemm][avx2]") {
  if (!dtr::cpu::sgemm_avx2_available()) {
    WARN("this build or CPU has no AVX2 + FMA: nothing to test");
    return;
  }
  std::vector<float> C0(3 * 5, 2.0f);
  const float dummy = 0.0f;
  sgemm_avx2(3, 4, 0, &dummy, 0, 1, &dummy, 4, 1, C0.data(), 5, true);
  for (float x : C0) CHECK(x == 2.0f);
  sgemm_avx2(3, 4, 0, &dummy, 0, 1, &dummy, 4, 1, C0.data(), 5, false);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) CHECK(C0[static_cast<size_t>(i * 5 + j)] == (j < 4 ? 0.0f : 2.0f));
  std::mt19937 g(19);
  struct Case {
    int64_t m, n, k;
    Layout la, lb;
  };
  // Row split with a short last K block; column split (n > 8 m); row chunks over 10 K blocks,
  // row chunks over 2 column blocks and column chunks, both over 2 K blocks: a chunk of block
  // b + 1 must not add to C tiles another thread is still writing in block b, and none may be
  // skipped or taken twice.
  const Case cases[] = {{130, 40, 770, Layout::Col, Layout::Row},
                        {20, 2000, 100, Layout::Row, Layout::Col},
                        {200, 40, 3800, Layout::Row, Layout::Row},
                        {200, 1100, 400, Layout::Row, Layout::Col},
                        {30, 1100, 400, Layout::Row, Layout::Col}};
  const int saved = omp_get_max_threads();
  for (const Case& c : cases) {
    INFO("m=" << c.m << " n=" << c.n << " k=" << c.k);
    omp_set_num_threads(1);
    check_one(c.m, c.n, c.k, c.la, c.lb, false, 0, g, sgemm_avx2);
    check_same_bits_2_3_threads(sgemm_avx2, c.m, c.n, c.k, make_operand(c.m, c.k, c.la, 1, g),
                                make_operand(c.k, c.n, c.lb, 1, g), 20);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("gemm's avx2+eigen dispatch: the AVX2 kernel for k <= 64 or m <= 8, Eigen elsewhere", "[avx2_eigen]") {
  using dtr::cpu::avx2_kernel_preferred;
  // The rule on dtr-bench gemm's shapes (T = 1024 tokens, LoRA rank 8).
  CHECK(avx2_kernel_preferred(1024, 1536, 8));   // lora 1024x8 @ 8x1536
  CHECK(avx2_kernel_preferred(8, 576, 1024));    // lora dA
  CHECK(avx2_kernel_preferred(256, 256, 64));    // attention bmm
  CHECK_FALSE(avx2_kernel_preferred(1024, 8, 1536));  // lora 1024x1536 @ [8x1536]^T
  CHECK_FALSE(avx2_kernel_preferred(576, 8, 1024));   // lora dB
  CHECK_FALSE(avx2_kernel_preferred(1024, 576, 576)); // layer
  if (dtr::cpu::sgemm_kernel() != dtr::cpu::SgemmKernel::avx2_eigen) {
    WARN("gemm<float> does not run avx2+eigen here (DTR_SGEMM=avx2+eigen selects it): dispatch not tested");
    return;
  }
  std::mt19937 g(23);
  const GemmFn via_gemm = [](int64_t m, int64_t n, int64_t k, const float* A, int64_t a_rs, int64_t a_cs,
                             const float* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool acc) {
    REQUIRE(ldc == n);
    dtr::cpu::gemm<float>(m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, acc);
  };
  struct Case {
    int64_t m, n, k;
    Layout la, lb;
  };
  // k <= 64 and m <= 8 go to sgemm_avx2: the same bits; the others to Eigen: within the bound.
  for (const Case& c : {Case{100, 70, 8, Layout::Row, Layout::Col}, Case{8, 300, 100, Layout::Col, Layout::Row},
                        Case{100, 8, 577, Layout::Row, Layout::Col}, Case{130, 90, 200, Layout::Col, Layout::Row}}) {
    INFO("m=" << c.m << " n=" << c.n << " k=" << c.k);
    check_one(c.m, c.n, c.k, c.la, c.lb, false, 0, g, via_gemm);
    check_one(c.m, c.n, c.k, c.la, c.lb, true, 0, g, via_gemm);
    const Operand A = make_operand(c.m, c.k, c.la, 1, g), B = make_operand(c.k, c.n, c.lb, 1, g);
    std::vector<float> viag(static_cast<size_t>(c.m * c.n)), kern(viag.size());
    via_gemm(c.m, c.n, c.k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, viag.data(), c.n, false);
    sgemm_avx2(c.m, c.n, c.k, A.buf.data(), A.rs, A.cs, B.buf.data(), B.rs, B.cs, kern.data(), c.n, false);
    if (avx2_kernel_preferred(c.m, c.n, c.k)) CHECK(std::memcmp(viag.data(), kern.data(), kern.size() * 4) == 0);
  }
}
