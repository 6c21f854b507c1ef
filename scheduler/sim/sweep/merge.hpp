// Merging a study's cell results: every metric per cell, and per group of cells that differ only in their
// seed (trace, pool, estimates, policy, load) the mean and a 95% confidence interval (Student t) across
// seeds; SVG plots of average and p99 JCT against load per policy with the intervals as bands, and the JCT
// CDF per policy at one load.
#pragma once

#include "cell.hpp"
#include "study.hpp"

#include <accelpool/common/result.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace accelpool::sweep {

// The two-sided 95% quantile of Student's t with `df` degrees of freedom (df >= 1): exact table values up to
// 30, a Cornish-Fisher expansion above (error < 1e-6).
double t95(std::size_t df);

struct MeanCi {
  double mean = 0;
  std::optional<double> half_width;  // the 95% interval is mean +- half_width; none for a single sample
};
// Mean and t-based 95% confidence half-width (t95(n-1) x sample sd / sqrt(n)). `values` non-empty.
MeanCi mean_ci(std::span<const double> values);

struct MergeSummary {
  std::size_t cells = 0;
  std::size_t groups = 0;
  double run_wall_s = 0;  // sum of the runs' own wall_s (host seconds spent simulating)
  std::vector<std::string> files;
};

// Reads every cell's result under `layout` and writes OUT/merged/: study.json (cells and groups),
// cells.csv, groups.csv and plots/*.svg. Refuses (naming how many and the first one) when a cell is not done,
// unless `partial`, in which case only done cells are merged. The output depends only on the results and
// the study (no wall times, no dates), so equal results give byte-identical files.
Result<MergeSummary> merge(const Study& study, const Layout& layout, bool partial);

}  // namespace accelpool::sweep
