#include "index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFFlat.h>

#include <algorithm>
#include <cmath>

namespace opforge::dedup {

std::unique_ptr<faiss::Index> make_index(int d, long n, const float* x, long exact_up_to, int nprobe) {
  using idx_t = faiss::Index::idx_t;
  if (n <= exact_up_to) {
    auto flat = std::make_unique<faiss::IndexFlatIP>(d);
    flat->add(static_cast<idx_t>(n), x);
    return flat;
  }
  // About 4*sqrt(n) lists, but never fewer than 8 vectors per list to train on.
  const auto nlist = static_cast<std::size_t>(
      std::clamp(4 * std::sqrt(static_cast<double>(n)), 1.0, std::max(1.0, static_cast<double>(n) / 8)));
  auto* quantizer = new faiss::IndexFlatIP(d);
  auto ivf = std::make_unique<faiss::IndexIVFFlat>(quantizer, d, nlist, faiss::METRIC_INNER_PRODUCT);
  ivf->own_fields = true;
  // k-means on 32 points per list is plenty to place the lists and keeps training to seconds:
  // faiss draws that sample itself (max_points_per_centroid), with cp.seed, so the lists, and so
  // the answers, are the same run to run.
  ivf->cp.seed = 1234;
  // 10 k-means iterations instead of faiss's 25: training is most of the build (100k x 10k on 2
  // cores: 26 s instead of 87 s) and the lists it places find the same pairs (bench/dedup_scale.cpp:
  // 953/999 and 199/200 at 100k, 286/299 and 60/60 at 30k, as exact search does there).
  ivf->cp.niter = 10;
  ivf->cp.max_points_per_centroid = 32;
  ivf->cp.min_points_per_centroid = 8;
  ivf->train(static_cast<idx_t>(n), x);
  ivf->add(static_cast<idx_t>(n), x);
  ivf->nprobe = static_cast<std::size_t>(nprobe);
  return ivf;
}

}  // namespace opforge::dedup
