// The faiss index dedup searches, chosen by size (exposed for bench/dedup_scale.cpp).
#pragma once
#include <cstdint>  // before faiss: its headers use uint8_t without including it (faiss 1.7.3)
#include <faiss/Index.h>

#include <memory>

#include "dedup.h"  // kExactUpTo

namespace opforge::dedup {

// Up to kExactUpTo vectors (dedup.h) the exact index (IndexFlatIP) answers in about a second.
// Above, brute force grows with n x m x dims (100k x 100k: minutes on few cores), so an inverted
// file takes over: IndexIVFFlat over inner product, about 4*sqrt(n) lists trained on a sample,
// probed kProbe lists deep. The pairs dedup looks for sit at cosine >= 0.95, close enough to
// share a list: at 30k tasks, 4, 8 and 16 probes all found the planted pairs the exact search
// found, in 3.9, 7.0 and 12.1 s (bench/dedup_scale.cpp); 8 keeps a margin.
constexpr int kProbe = 8;

// An index holding the n row vectors of x (n x d, unit length), trained if it needs training.
std::unique_ptr<faiss::Index> make_index(int d, long n, const float* x, long exact_up_to = kExactUpTo,
                                         int nprobe = kProbe);

}  // namespace opforge::dedup
