// The token pick on the device (argmax, penalties, top-k, the draw over top-k or the whole
// vocabulary) against the host sampler.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/elementwise.cuh"
#include "cuda/pick.cuh"
#include "engine/sampler.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

// Penalties and top-k on the device = the host sampler's: the llama.cpp penalty formula on
// the listed tokens (bit for bit), then sampling::top_k's candidates and order (value
// descending, id ascending), over vocabularies below, at and above the kernels' chunking,
// with ties at the cut and -inf logits.
TEST(CudaKernels, PenaltiesAndTopKMatchTheHostSampler) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(53);
  for (int64_t n : {100, 1024, 1025, 32000, 151936, 300000}) {  // 300000: more lists than merge threads
    for (int k : {1, 40, 99, 256}) {
      if (k >= n) continue;
      auto l = random_floats(rng, n, 2.0f);
      l[static_cast<size_t>(n / 2)] = l[static_cast<size_t>(n / 3)] = 7.5f;  // a tie near the top
      // A run of equal values wider than k, so the cut falls inside a tie (ids decide), and
      // two -inf, one of which is in the top 99 of 100.
      for (int64_t i = 10; i < std::min<int64_t>(n - 2, 10 + k + 5); ++i) l[static_cast<size_t>(i)] = 6.0f;
      l[static_cast<size_t>(n - 1)] = l[static_cast<size_t>(n - 2)] = -INFINITY;
      cuda::PickDev pd{};
      pd.repeat = 1.3f;
      pd.frequency = 0.25f;
      pd.presence = 0.5f;
      std::vector<float> ref = l;
      for (int i = 0; i < 60; ++i) {
        const int32_t id = static_cast<int32_t>((i * 7919) % n);
        bool dup = false;
        for (int j = 0; j < pd.n_pen; ++j) dup |= pd.pen[2 * j] == id;
        if (dup) continue;
        pd.pen[2 * pd.n_pen] = id;
        pd.pen[2 * pd.n_pen + 1] = 1 + i % 4;
        float& v = ref[static_cast<size_t>(id)];
        v = sampling::penalized(v, 1 + i % 4, pd.repeat, pd.frequency, pd.presence);  // the host's own
        ++pd.n_pen;
      }
      std::vector<TokenLogit> want;
      for (int64_t i = 0; i < n; ++i) want.push_back({static_cast<int32_t>(i), ref[static_cast<size_t>(i)]});
      sampling::top_k(want, k);
      Dev<float> dl(l);
      Dev<uint8_t> dpick(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&pd),
                                              reinterpret_cast<const uint8_t*>(&pd) + sizeof(pd)));
      Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::topk_scratch_bytes(n, k)));
      Dev<int32_t> ids(std::vector<int32_t>(static_cast<size_t>(k), -1));
      Dev<float> vals(static_cast<size_t>(k));
      cuda::launch_penalties(dl.p, reinterpret_cast<const cuda::PickDev*>(dpick.p), nullptr, nullptr);
      EXPECT_EQ(dl.get(), ref) << "penalties, n " << n;
      cuda::launch_topk(dl.p, n, k, scratch.p, ids.p, vals.p, nullptr);
      const auto gi = ids.get();
      const auto gv = vals.get();
      for (int r = 0; r < k; ++r) {
        EXPECT_EQ(gi[static_cast<size_t>(r)], want[static_cast<size_t>(r)].id) << "n " << n << " k " << k << " rank " << r;
        EXPECT_EQ(gv[static_cast<size_t>(r)], want[static_cast<size_t>(r)].logit) << "n " << n << " k " << k << " rank " << r;
      }
    }
  }
}

// A step enqueued ahead penalises over the window of the step before it with its own token
// entering (PickDev::entering) and the oldest leaving: the host's formula on the counts that
// window has, bit for bit. The token new to the window, or listed; the one leaving down to
// zero (no penalty left), or down by one; the same token entering and leaving; nothing
// leaving; a full list of kPickMaxPenalties with a new token entering.
TEST(CudaKernels, PenaltiesOfAStepAheadTakeItsTokenEntering) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(61);
  const int64_t n = 151936;
  struct Case {
    int n_list, entering, leaving;
  };
  // The list: ids 100 * i + 7 (then + 13 and + 26 past 1500 entries), counts 1 + i % 3 (so id 7
  // has count 1, 107 count 2, 207 count 3).
  const Case cases[] = {{60, 5, 7}, {60, 307, 107}, {60, 207, 207}, {60, 5, -1}, {60, 407, -1},
                        {cuda::kPickMaxPenalties, 5, 7}, {0, 5, -1}};
  for (const Case& c : cases) {
    const auto l = random_floats(rng, n, 2.0f);
    auto pd = std::make_unique<cuda::PickDev>();
    pd->n_pen = c.n_list;
    pd->entering = 1;
    pd->leaving = c.leaving;
    pd->repeat = 1.3f;
    pd->frequency = 0.25f;
    pd->presence = 0.5f;
    std::map<int32_t, int> counts;
    for (int i = 0; i < c.n_list; ++i) {
      const int32_t id = 7 + 100 * (i % 1500) + 13 * (i / 1500);
      ASSERT_EQ(counts.count(id), 0u);
      pd->pen[2 * i] = id;
      pd->pen[2 * i + 1] = 1 + i % 3;
      counts[id] = 1 + i % 3;
    }
    ++counts[c.entering];
    if (c.leaving >= 0 && --counts[c.leaving] == 0) counts.erase(c.leaving);
    std::vector<float> ref = l;
    for (const auto& [id, count] : counts) {
      float& v = ref[static_cast<size_t>(id)];
      v = sampling::penalized(v, count, pd->repeat, pd->frequency, pd->presence);
    }
    Dev<float> dl(l);
    Dev<uint8_t> dpick(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(pd.get()),
                                            reinterpret_cast<const uint8_t*>(pd.get()) + sizeof(cuda::PickDev)));
    Dev<int32_t> token(std::vector<int32_t>{c.entering});
    cuda::launch_penalties(dl.p, reinterpret_cast<const cuda::PickDev*>(dpick.p), token.p, nullptr);
    EXPECT_EQ(dl.get(), ref) << "list " << c.n_list << ", entering " << c.entering << ", leaving " << c.leaving;
  }
}

// Top-k where equal logits at the k-th best outnumber what the kernels sort in one block
// (2048 candidates; all equal, or 3000 tied at the top spread over the vocabulary): the
// exact slow path, sampling::top_k's ids and values.
TEST(CudaKernels, TopKOfWideTiesMatchesTheHostSampler) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int64_t n = 151936;
  std::vector<std::vector<float>> inputs{std::vector<float>(static_cast<size_t>(n), 1.0f),
                                         std::vector<float>(static_cast<size_t>(n), -INFINITY)};
  auto spread = random_floats(rng, n, 2.0f);
  for (int i = 0; i < 3000; ++i) spread[static_cast<size_t>((i * 50627) % n)] = 9.0f;
  inputs.push_back(spread);
  for (size_t c = 0; c < inputs.size(); ++c) {
    for (int k : {1, 40, 256}) {
      std::vector<TokenLogit> want;
      for (int64_t i = 0; i < n; ++i) want.push_back({static_cast<int32_t>(i), inputs[c][static_cast<size_t>(i)]});
      sampling::top_k(want, k);
      Dev<float> dl(inputs[c]);
      Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::topk_scratch_bytes(n, k)));
      Dev<int32_t> ids(std::vector<int32_t>(static_cast<size_t>(k), -1));
      Dev<float> vals(static_cast<size_t>(k));
      cuda::launch_topk(dl.p, n, k, scratch.p, ids.p, vals.p, nullptr);
      const auto gi = ids.get();
      const auto gv = vals.get();
      for (int r = 0; r < k; ++r) {
        ASSERT_EQ(gi[static_cast<size_t>(r)], want[static_cast<size_t>(r)].id) << "input " << c << " k " << k << " rank " << r;
        ASSERT_EQ(gv[static_cast<size_t>(r)], want[static_cast<size_t>(r)].logit) << "input " << c << " k " << k;
      }
    }
  }
}

// A draw's chain after top-k, and the parameters a draw kernel reads in place (mapped pinned
// memory, as the backend's draw_host_), set for one draw.
struct DrawChain {
  float top_p, min_p, temp;
};

struct MappedDraw {
  cuda::DrawDev* d = nullptr;
  MappedDraw() { EXPECT_EQ(cudaHostAlloc(&d, sizeof(cuda::DrawDev), cudaHostAllocMapped), cudaSuccess); }
  ~MappedDraw() { cudaFreeHost(d); }
  MappedDraw(const MappedDraw&) = delete;
  MappedDraw& operator=(const MappedDraw&) = delete;
  const cuda::DrawDev* set(DrawChain c, double u) {
    *d = {.u = u, .top_p = c.top_p, .min_p = c.min_p, .log_min_p = c.min_p > 0 ? std::log(c.min_p) : 0.0f,
          .temp = c.temp};
    return d;
  }
};

// The draw on the device = sampling::finish on the same top k: random lists in top-k order
// (a tie at the top, -inf at the tail), top-p and min-p off and on (min-p above 1 keeps the
// first alone), temperatures below and above 1, uniforms 0, just below 1 and random; the
// position it feeds one further.
TEST(CudaKernels, DrawMatchesTheHostFinish) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(71);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  MappedDraw draw;
  int moved = 0;  // draws whose token is not the first candidate: the walk itself was tested
  for (int k : {1, 2, 40, 256}) {
    for (const DrawChain c : {DrawChain{1.0f, 0.0f, 1.0f}, DrawChain{0.95f, 0.05f, 0.8f}, DrawChain{0.5f, 0.0f, 1.5f},
                              DrawChain{1.0f, 0.2f, 0.3f}, DrawChain{0.9f, 1.5f, 1.0f}}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<TokenLogit> top;
        const auto v = random_floats(rng, k, 3.0f);
        for (int i = 0; i < k; ++i) top.push_back({static_cast<int32_t>((i * 7717 + trial) % 50000), v[static_cast<size_t>(i)]});
        if (k > 2 && trial % 2) top[1].logit = top[0].logit;  // equal values: ids decide the order
        if (k > 2) top[static_cast<size_t>(k - 1)].logit = -INFINITY;
        sampling::sort_desc(top);
        const double u = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : uni(rng);
        std::vector<TokenLogit> host = top;
        const int32_t want = sampling::finish(host, c.top_p, c.min_p, c.temp, u);
        moved += want != top[0].id;
        std::vector<int32_t> ids;
        std::vector<float> vals;
        for (const TokenLogit& t : top) {
          ids.push_back(t.id);
          vals.push_back(t.logit);
        }
        Dev<int32_t> did(ids), pos(std::vector<int32_t>{9});
        Dev<float> dv(vals);
        cuda::launch_draw(did.p, dv.p, k, draw.set(c, u), did.p, nullptr, pos.p);  // the token where the list was
        EXPECT_EQ(did.get()[0], want) << "k " << k << " top_p " << c.top_p << " min_p " << c.min_p << " temp "
                                      << c.temp << " u " << u;
        EXPECT_EQ(pos.get()[0], 10);
      }
    }
  }
  EXPECT_GT(moved, 50);  // 71 with this seed
}

// Top-k off: the draw over every logit on the device = sampling::finish over the whole
// vocabulary (id order), or -1 exactly where the device's 256 best cannot decide it (the host's
// survivors are at least 256), and then the exact draw (the vocabulary sorted) = finish. Vocabularies with a short last chunk; peaked logits (a few far
// above the rest: top-p's cut and min-p's survivors among the 256), flat ones (neither);
// top-p alone, min-p alone (its survivors re-ordered by id), both, neither (the draw over
// every logit by chunk sums), min-p above 1; uniforms 0, just below 1 and random (the same
// token), and at the chunked mass through a random survivor and just below it (that survivor or
// the next: exp's last bit may differ).
TEST(CudaKernels, WholeVocabularyDrawMatchesTheHostFinish) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(73);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  MappedDraw draw;
  int decided = 0, undecided = 0, moved = 0, far = 0;
  for (int64_t n : {1000, 32000, 151936}) {
    Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::topk_scratch_bytes(n, cuda::kPickMaxTopK)));
    Dev<double> sums(static_cast<size_t>(cuda::draw_sums_bytes(n) / sizeof(double)));
    Dev<uint8_t> exact(std::vector<uint8_t>(cuda::exact_draw_scratch_bytes(n)));
    for (const bool peaked : {true, false}) {
      auto x = random_floats(rng, n, peaked ? 2.0f : 0.3f);
      if (peaked)
        for (int i = 0; i < 12; ++i) x[static_cast<size_t>((i * 7919 + 5) % n)] = 14.0f - 0.5f * i;
      Dev<float> dx(x);
      Dev<int32_t> ids(std::vector<int32_t>(cuda::kPickMaxTopK));
      Dev<float> vals(static_cast<size_t>(cuda::kPickMaxTopK));
      cuda::launch_topk(dx.p, n, cuda::kPickMaxTopK, scratch.p, ids.p, vals.p, nullptr);
      for (const DrawChain c : {DrawChain{0.9f, 0.0f, 1.0f}, DrawChain{1.0f, 0.05f, 0.7f},
                                DrawChain{0.95f, 0.05f, 1.3f}, DrawChain{1.0f, 0.0f, 1.0f},
                                DrawChain{1.0f, 0.0f, 0.6f}, DrawChain{0.8f, 1.5f, 1.0f}}) {
        // What the host's chain keeps before the draw (in its order: id order, or top-p's sorted
        // prefix), and the draw's mass through a random survivor, by chunks, for the boundary
        // uniforms: there any other order of the sums would move the token.
        std::vector<TokenLogit> host;
        for (int64_t i = 0; i < n; ++i) host.push_back({static_cast<int32_t>(i), x[static_cast<size_t>(i)]});
        std::vector<TokenLogit> survivors = host;
        sampling::top_p(survivors, c.top_p);
        sampling::min_p(survivors, c.min_p);
        const size_t m = survivors.size();
        float vmax = survivors[0].logit;
        for (const TokenLogit& t : survivors) vmax = std::max(vmax, t.logit);
        const auto term = [&](size_t i) {
          return std::exp(double(survivors[i].logit / c.temp) - double(vmax / c.temp));
        };
        const size_t at_survivor = static_cast<size_t>(uni(rng) * double(m - 1));
        double total = 0, mass = 0;
        for (size_t b0 = 0; b0 < m; b0 += 256) {
          double sum = 0;
          for (size_t i = b0; i < std::min(m, b0 + 256); ++i) {
            sum += term(i);
            if (i == at_survivor) mass = total + sum;
          }
          total += sum;
        }
        double u_edge = mass / total;
        while (u_edge * total < mass) u_edge = std::nextafter(u_edge, 1.0);
        while (std::nextafter(u_edge, 0.0) * total >= mass) u_edge = std::nextafter(u_edge, 0.0);
        const bool plain = c.top_p >= 1.0f && c.min_p <= 0.0f;
        for (int trial = 0; trial < 6; ++trial) {
          const double u = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : trial == 4 ? u_edge
                           : trial == 5 ? std::nextafter(u_edge, 0.0) : uni(rng);
          std::vector<TokenLogit> chain = host;
          const int32_t want = sampling::finish(chain, c.top_p, c.min_p, c.temp, u);
          // At the boundary the host draws the survivor after it, just below the survivor
          // itself; the device's exp may differ from the host's in its last bit, which moves a
          // draw that close to either side (pick.cuh), so there it may give either.
          const bool edge = trial >= 4 && m > 1;
          if (edge) {
            EXPECT_EQ(want, survivors[at_survivor + (trial == 4 ? 1 : 0)].id);
          }
          const auto matches = [&](int32_t token) {
            return token == want ||
                   (edge && (token == survivors[at_survivor].id || token == survivors[at_survivor + 1].id));
          };
          Dev<int32_t> out(std::vector<int32_t>{-7}), pos(std::vector<int32_t>{3});
          cuda::launch_draw_whole(dx.p, n, ids.p, vals.p, draw.set(c, u), sums.p, out.p, nullptr, pos.p);
          const int32_t got = out.get()[0];
          const std::string what = "n " + std::to_string(n) + (peaked ? " peaked" : " flat") + " top_p " +
                                   std::to_string(c.top_p) + " min_p " + std::to_string(c.min_p) + " temp " +
                                   std::to_string(c.temp) + " u " + std::to_string(u);
          EXPECT_EQ(pos.get()[0], 4) << what;
          if (got == -1) {
            ++undecided;
            EXPECT_GE(m, 256u) << what << ": undecided with few survivors";
            EXPECT_FALSE(plain) << what;
            cuda::launch_exact_draw(dx.p, n, *draw.d, exact.p, out.p, nullptr);
            EXPECT_TRUE(matches(out.get()[0])) << what << ": " << out.get()[0] << " for " << want << " (exact, " << m
                                                << " survivors)";
            moved += out.get()[0] != survivors[0].id;
            far += at_survivor >= 256 && trial >= 4;
            continue;
          }
          ++decided;
          EXPECT_TRUE(matches(got)) << what << ": " << got << " for " << want << " (" << m << " survivors)";
          moved += got != survivors[0].id;
          far += at_survivor >= 256 && trial >= 4;
        }
      }
    }
  }
  EXPECT_GT(decided, 60);
  EXPECT_GT(undecided, 5);  // flat logits with top-p or min-p: the exact draw
  EXPECT_GT(moved, 30);
  EXPECT_GT(far, 10);  // boundaries past the first chunk
}

// Device argmax = greedy_token: random logits over vocabulary sizes around the grid's stride,
// a tie for the largest value (the lower id wins), all -inf (id 0); with a position to
// advance, the same id and the position one further.
TEST(CudaKernels, ArgmaxMatchesGreedyToken) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(31);
  Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::argmax_scratch_bytes()));
  for (int64_t n : {1, 7, 255, 256, 32768, 32769, 151936}) {
    auto x = random_floats(rng, n);
    std::vector<std::vector<float>> inputs{x};
    if (n > 200) {
      x[n / 3] = 50.0f;
      x[n - 2] = 50.0f;  // the same largest value twice: id n/3 must win
      inputs.push_back(x);
    }
    inputs.push_back(std::vector<float>(static_cast<size_t>(n), -INFINITY));
    for (const auto& in : inputs) {
      Dev<float> dx(in);
      Dev<int32_t> out(std::vector<int32_t>{-1}), pos(std::vector<int32_t>{41});
      cuda::launch_argmax(dx.p, n, scratch.p, out.p, nullptr);
      EXPECT_EQ(out.get()[0], greedy_token(in.data(), n)) << "n " << n;
      cuda::launch_argmax(dx.p, n, scratch.p, out.p, nullptr, pos.p);  // with the position it feeds
      EXPECT_EQ(out.get()[0], greedy_token(in.data(), n)) << "n " << n;
      EXPECT_EQ(pos.get()[0], 42) << "n " << n;
    }
  }
}

}  // namespace
}  // namespace frink::test

#endif  // FRINK_HAVE_CUDA
