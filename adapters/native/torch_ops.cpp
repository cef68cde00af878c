// roicore's RoI operators as PyTorch operators: TORCH_LIBRARY(roicore) with CPU kernels on
// roicore's C library (roicore.h), autograd formulas, and torchvision's CPU autocast rule
// for roi_align.  roicore.adapters.torch builds this file with torch.utils.cpp_extension
// (roicore.adapters.native.torch) and loads it with torch.ops.load_library; a TorchScript
// module or an AOTInductor package that calls these ops runs in any process that loads the
// library, roicore itself not needed.
//
// The ops and their schemas are those the adapter registered in Python before this library
// existed (torch.library.custom_op, still its fallback without a C++ compiler), so
// programs exported through either path load in a process that has the other:
//
//   roi_pool(input, rois, spatial_scale, pooled_height, pooled_width, need_argmax,
//            n_threads) -> (output, argmax)     argmax empty unless need_argmax
//   roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
//             aligned, n_threads)
//   ps_roi_pool(input, rois, spatial_scale, pooled_height, pooled_width, n_threads)
//   ps_roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
//                n_threads)
//   and each one's <name>_backward, the gradient with respect to input;
//   multi_scale_roi_align(maps, rois, spatial_scales, pooled_height, pooled_width,
//                         sampling_ratio, aligned, first_level, canonical_level,
//                         canonical_size, n_threads)   torchvision's MultiScaleRoIAlign:
//       each box pooled from the pyramid level torchvision's LevelMapper assigns it, and
//   multi_scale_roi_align_backward(grad, rois, ..., input_shapes, ...) -> one gradient per map.
//
// input is a (N, C, H, W) map, rois a (K, 5) tensor of [batch_index, x1, y1, x2, y2] rows;
// float32 and float64 are computed as they come, float16 and bfloat16 in float32 with the
// result rounded once to the input's dtype; n_threads None follows
// torch.get_num_threads().  Every op computes in torchvision's arithmetic (the
// "torchvision" convention of roicore.core.conventions, see ROICORE_TORCHVISION_* below).
//
// Errors are c10 errors with roicore's messages, raised in Python as ValueError for a bad
// value or shape, TypeError for a bad dtype, torch.OutOfMemoryError past roicore's memory
// limit, RuntimeError for a call stopped by Ctrl-C; nothing reaches a kernel unchecked.
// The fake (meta) implementations are Python, registered by roicore.adapters.torch (see
// set_python_module below).

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "roicore.h"

// The torchvision convention's rules, as the integer codes roicore_*_rules_from_array
// decodes.  They are defined once, in roicore.core.conventions (Python): the builder
// (roicore.adapters.native.torch) passes roicore.core.args.rules_codes(...) of each table
// entry as a -D definition, and the codes are part of the build's cache key, so a changed
// convention builds a new library.  Compile-time constants rather than data handed over
// when the library loads, because a deployment (a TorchScript module, an AOTInductor
// package) loads the library without roicore's Python package.
#if !defined(ROICORE_TORCHVISION_MAX_POOL_RULES) ||      \
    !defined(ROICORE_TORCHVISION_PS_ROI_POOL_RULES) ||   \
    !defined(ROICORE_TORCHVISION_ROI_ALIGN_RULES) ||     \
    !defined(ROICORE_TORCHVISION_PS_ROI_ALIGN_RULES) ||   \
    !defined(ROICORE_TORCHVISION_LEVEL_RULES)
#error "build with -DROICORE_TORCHVISION_<OP>_RULES=<codes> (roicore.adapters.native.torch does)"
#endif

// The one symbol this library exports besides the framework's registrations: it points
// the library's copy of roicore's C library at the runtime of roicore.core's (memory
// limit, kept scratch, Ctrl-C; see roicore.h), which roicore.adapters does right after
// loading it.  0 when shared, else the C API's status.
extern "C" __attribute__((visibility("default"))) int roicore_native_share_runtime(
    void* runtime) {
  return roicore_runtime_share(static_cast<roicore_runtime*>(runtime), nullptr);
}

namespace roicore_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ------------------------------------------------------------------------------------
// Messages and errors

std::string ShapeText(at::IntArrayRef shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << (shape.size() == 1 ? ",)" : ")");
  return s.str();
}

std::string DtypeText(at::ScalarType type) {
  return "torch." + std::string(c10::getDtypeNames(type).first);
}

// The C library names the feature map "x"; the ops call it "input", as torchvision does.
std::string InCallersWords(const char* message) {
  std::string m(message);
  if (m.size() > 1 && m[0] == 'x' && (m[1] == ' ' || m[1] == '[')) m.replace(0, 1, "input");
  return m;
}

// A failed C API call as the c10 error of its kind, with roicore's message.
void Check(int status, const roicore_error& err) {
  if (status == ROICORE_OK) return;
  const std::string message = InCallersWords(err.message);
  switch (status) {
    case ROICORE_ERR_MEMORY:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    case ROICORE_ERR_UNSUPPORTED:
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    case ROICORE_ERR_INTERRUPTED:  // Ctrl-C: Python raises its KeyboardInterrupt after it
      TORCH_CHECK(false, message);
    default:  // ARGUMENT, VALUE: the caller's input
      TORCH_CHECK_VALUE(false, message);
  }
}

// Runs `call(&err)`, a C API call, raising its error.
template <typename Call>
void Run(Call call) {
  roicore_error err{};
  const int status = call(&err);
  Check(status, err);
}

// ------------------------------------------------------------------------------------
// The torchvision convention's rules, decoded (and range-checked) once

template <typename Rules, size_t N>
Rules Decode(roicore_status (*from_array)(const int64_t*, int64_t, Rules*, roicore_error*),
             const int64_t (&codes)[N]) {
  Rules rules{};
  Run([&](roicore_error* err) { return from_array(codes, static_cast<int64_t>(N), &rules, err); });
  return rules;
}

const roicore_max_pool_rules& MaxPoolRules() {
  static const int64_t codes[] = {ROICORE_TORCHVISION_MAX_POOL_RULES};
  static const roicore_max_pool_rules rules = Decode(roicore_max_pool_rules_from_array, codes);
  return rules;
}

const roicore_ps_roi_pool_rules& PsRoiPoolRules() {
  static const int64_t codes[] = {ROICORE_TORCHVISION_PS_ROI_POOL_RULES};
  static const roicore_ps_roi_pool_rules rules =
      Decode(roicore_ps_roi_pool_rules_from_array, codes);
  return rules;
}

const roicore_roi_align_rules& RoiAlignRules() {
  static const int64_t codes[] = {ROICORE_TORCHVISION_ROI_ALIGN_RULES};
  static const roicore_roi_align_rules rules = Decode(roicore_roi_align_rules_from_array, codes);
  return rules;
}

const roicore_level_rules& LevelRules() {
  static const int64_t codes[] = {ROICORE_TORCHVISION_LEVEL_RULES};
  static const roicore_level_rules rules = Decode(roicore_level_rules_from_array, codes);
  return rules;
}

const roicore_ps_roi_align_rules& PsRoiAlignRules() {
  static const int64_t codes[] = {ROICORE_TORCHVISION_PS_ROI_ALIGN_RULES};
  static const roicore_ps_roi_align_rules rules =
      Decode(roicore_ps_roi_align_rules_from_array, codes);
  return rules;
}

// ------------------------------------------------------------------------------------
// Arguments

bool Computed(at::ScalarType t) { return t == at::kFloat || t == at::kDouble; }

// A floating tensor the ops take: float32, float64, float16 or bfloat16, on the CPU.
void CheckFloat(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is an undefined tensor");
  const at::ScalarType type = t.scalar_type();
  TORCH_CHECK_TYPE(Computed(type) || type == at::kHalf || type == at::kBFloat16, op, ": ",
                   name, " must be float32, float64, float16 or bfloat16, got ",
                   DtypeText(type));
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " is on ", t.device().str(),
                    "; roicore's operators compute on the CPU");
}

// `t` C-contiguous in the dtype the C library computes in (float16 and bfloat16: float32);
// no copy when it already is.
at::Tensor Computable(const at::Tensor& t) {
  return (Computed(t.scalar_type()) ? t : t.to(at::kFloat)).contiguous();
}

roicore_dtype DtypeOf(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? ROICORE_FLOAT64 : ROICORE_FLOAT32;
}

// The result in the dtype of `like` (float16 and bfloat16 rounded once from float32).
at::Tensor Result(const at::Tensor& y, const at::Tensor& like) {
  return y.scalar_type() == like.scalar_type() ? y : y.to(like.scalar_type());
}

// A checked 4-D map (an input, or a gradient), C-contiguous in its compute dtype, and its
// description for the C library.  `dims` names its dimensions, e.g. "(N, C, H, W)".
struct Map {
  at::Tensor data;
  roicore_tensor view;
};

Map ReadMap(const char* op, const at::Tensor& t, const char* name, const char* dims,
            const char* hw) {
  CheckFloat(op, t, name);
  TORCH_CHECK_VALUE(t.dim() == 4, op, ": ", name, " must be a 4-D Tensor", dims, ", got shape ",
                    ShapeText(t.sizes()));
  TORCH_CHECK_VALUE(t.size(2) >= 1 && t.size(3) >= 1, op, ": ", name, " must have ", hw,
                    " >= 1, got shape ", ShapeText(t.sizes()));
  Map m;
  m.data = Computable(t);
  m.view = roicore_tensor{};
  m.view.data = m.data.data_ptr();
  m.view.dtype = DtypeOf(m.data);
  m.view.layout = ROICORE_NCHW;
  m.view.n = m.data.size(0);
  m.view.c = m.data.size(1);
  m.view.h = m.data.size(2);
  m.view.w = m.data.size(3);
  return m;
}

Map ReadInput(const char* op, const at::Tensor& input) {
  return ReadMap(op, input, "input", "[N, C, H, W]", "H >= 1 and W");
}

Map ReadGrad(const char* op, const at::Tensor& grad) {
  return ReadMap(op, grad, "grad", "[K, C, PH, PW] (the output's gradient)", "PH >= 1 and PW");
}

// Boxes as the C library takes them: (K, 4) [x1, y1, x2, y2] rows in the map's dtype and
// the checked image of each box, from torchvision's (K, 5) rois.  The messages name them
// "boxes", as the adapter's functions and roicore.core do.
struct Boxes {
  at::Tensor coords, batch;
  roicore_boxes view;
};

Boxes ReadRois(const char* op, const at::Tensor& rois_in, int64_t n_images,
               roicore_dtype dtype) {
  CheckFloat(op, rois_in, "rois");
  TORCH_CHECK_VALUE(rois_in.dim() == 2 && rois_in.size(1) == 5, op,
                    ": rois must be a Tensor[K, 5] of [batch_index, x1, y1, x2, y2] rows, got "
                    "shape ", ShapeText(rois_in.sizes()));
  const at::Tensor rois = Computable(rois_in);
  const int64_t k = rois.size(0);
  Boxes b;
  b.batch = at::empty({k}, at::kLong);
  b.coords = at::empty({k, 4}, dtype == ROICORE_FLOAT64 ? at::kDouble : at::kFloat);
  if (k > 0) {
    Run([&](roicore_error* err) {
      return roicore_batch_from_column(rois.data_ptr(), DtypeOf(rois), 5, k, n_images,
                                       /*masked=*/0, "boxes[:, 0]",
                                       b.batch.data_ptr<int64_t>(), err);
    });
    Run([&](roicore_error* err) {
      return roicore_convert_coords(rois.data_ptr(), DtypeOf(rois), 5, 1, /*yx=*/0, k,
                                    b.coords.data_ptr(), dtype, err);
    });
    Run([&](roicore_error* err) {
      return roicore_check_coords(b.coords.data_ptr(), dtype, k, 0, 0, "boxes", err);
    });
  }
  b.view = roicore_boxes{};
  b.view.coords = k > 0 ? b.coords.data_ptr() : nullptr;
  b.view.batch = k > 0 ? b.batch.data_ptr<int64_t>() : nullptr;
  b.view.k = k;
  return b;
}

void CheckScale(const char* op, double spatial_scale) {
  TORCH_CHECK_VALUE(std::isfinite(spatial_scale) && spatial_scale > 0, op,
                    ": spatial_scale must be positive and finite, got ", spatial_scale);
}

void CheckPooled(const char* op, int64_t ph, int64_t pw) {
  TORCH_CHECK_VALUE(ph >= 1 && pw >= 1, op,
                    ": pooled_height and pooled_width must be >= 1, got (", ph, ", ", pw, ")");
}

void CheckSamplingRatio(const char* op, int64_t sampling_ratio) {
  TORCH_CHECK_VALUE(sampling_ratio >= -1, op,
                    ": sampling_ratio must be >= -1 (-1 or 0: adaptive), got ", sampling_ratio);
  TORCH_CHECK_VALUE(sampling_ratio <= ROICORE_MAX_SAMPLING_RATIO, op,
                    ": sampling_ratio must be <= ", ROICORE_MAX_SAMPLING_RATIO,
                    " (at most 2**20 samples per bin), got ", sampling_ratio);
}

// The forward's input shape, which a gradient op is given.
void CheckImageShape(const char* op, int64_t n, int64_t c, int64_t h, int64_t w) {
  TORCH_CHECK_VALUE(n >= 0 && c >= 0 && h >= 1 && w >= 1, op,
                    ": (batch_size, channels, height, width) must be >= 0, and height and width "
                    ">= 1, got (", n, ", ", c, ", ", h, ", ", w, ")");
}

// D of a position-sensitive map of C = D * PH * PW channels; `what` names C's source.
int64_t PsChannels(const char* op, int64_t c, int64_t ph, int64_t pw, const char* what) {
  const int64_t area = ph * pw;
  TORCH_CHECK_VALUE(c % area == 0, op, ": ", what, " has C=", c,
                    " channels, which is not a multiple of the group area ", ph, "x", pw, "=",
                    area);
  return c / area;
}

// The gradient of a (K, D, PH, PW) output, checked against the forward's K and D.
void CheckGradShape(const char* op, const Map& g, int64_t k, int64_t d) {
  TORCH_CHECK_VALUE(g.view.n == k && g.view.c == d, op, ": grad must have shape (", k, ", ", d,
                    ", PH, PW) (one (", d, ", PH, PW) gradient per box), got ",
                    ShapeText(g.data.sizes()));
}

roicore_exec Exec(const char* op, std::optional<int64_t> n_threads) {
  int64_t n = at::get_num_threads();
  if (n_threads.has_value()) {
    n = *n_threads;
    TORCH_CHECK_VALUE(n != 0, op,
                      ": n_threads = 0 is invalid: pass a positive count, a negative count "
                      "relative to the CPU count, or None");
    TORCH_CHECK_VALUE(n <= ROICORE_MAX_THREADS, op, ": n_threads must be at most ",
                      ROICORE_MAX_THREADS, ", got ", n);
    // all CPUs but more than there are: one thread
    if (n < std::numeric_limits<int32_t>::min()) n = std::numeric_limits<int32_t>::min();
  }
  roicore_exec exec{};
  exec.n_threads = static_cast<int32_t>(n);
  return exec;
}

// Bytes of an array of `shape` in `type`; -1 when the product overflows (roicore_mul).
int64_t Bytes(at::IntArrayRef shape, at::ScalarType type) {
  int64_t bytes = static_cast<int64_t>(c10::elementSize(type));
  for (int64_t d : shape) bytes = roicore_mul(bytes, d);
  return bytes;
}

// a + b for byte counts, -1 (over every limit) when either is or the sum overflows.
int64_t AddBytes(int64_t a, int64_t b) {
  return a < 0 || b < 0 || a > std::numeric_limits<int64_t>::max() - b ? -1 : a + b;
}

// A fresh output of `shape` in `type`, refused beforehand when the call's allocations would
// pass roicore's memory limit together (sizes whose product overflows included): this
// output, the copy that Result rounds it into for a float16 or bfloat16 `like`, and `also`
// more bytes (roi_pool's argmax), so that no two allocations each within the limit
// exhaust memory between them.
at::Tensor Output(at::IntArrayRef shape, at::ScalarType type, const at::Tensor& like,
                  int64_t also = 0) {
  int64_t bytes = AddBytes(Bytes(shape, type), also);
  if (like.scalar_type() != type) bytes = AddBytes(bytes, Bytes(shape, like.scalar_type()));
  const std::string what = "the output of shape " + ShapeText(shape);
  Run([&](roicore_error* err) { return roicore_check_allocation(bytes, what.c_str(), err); });
  return at::empty(shape, at::TensorOptions().dtype(type));
}

roicore_out_tensor OutView(const at::Tensor& t) {
  roicore_out_tensor v{};
  v.data = t.data_ptr();
  v.dtype = DtypeOf(t);
  v.layout = ROICORE_NCHW;
  v.n = t.size(0);
  v.c = t.size(1);
  v.h = t.size(2);
  v.w = t.size(3);
  return v;
}

// ------------------------------------------------------------------------------------
// CPU kernels

std::tuple<at::Tensor, at::Tensor> RoiPoolCpu(const at::Tensor& input, const at::Tensor& rois,
                                              double spatial_scale, int64_t ph, int64_t pw,
                                              bool need_argmax,
                                              std::optional<int64_t> n_threads) {
  const char* op = "roicore::roi_pool";
  const auto& rules = MaxPoolRules();
  CheckFloat(op, input, "input");
  CheckFloat(op, rois, "rois");
  const Map x = ReadInput(op, input);
  CheckPooled(op, ph, pw);
  CheckScale(op, spatial_scale);
  const Boxes b = ReadRois(op, rois, x.view.n, x.view.dtype);
  const roicore_exec exec = Exec(op, n_threads);
  roicore_index_type argmax_type = ROICORE_INT32;
  if (need_argmax) {
    // h*W + w per plane, widened to int64 for planes of 2**31 - 1 pixels or more
    Run([&](roicore_error* err) {
      return roicore_max_pool_argmax_type(&rules, &x.view, &argmax_type, err);
    });
  }
  const at::ScalarType index = argmax_type == ROICORE_INT32 ? at::kInt : at::kLong;
  const std::vector<int64_t> shape{b.view.k, x.view.c, ph, pw};
  // the argmax is checked with the output, and so allocated unchecked
  const at::Tensor out = Output(shape, x.data.scalar_type(), input,
                                need_argmax ? Bytes(shape, index) : 0);
  const at::Tensor argmax = need_argmax ? at::empty(shape, at::TensorOptions().dtype(index))
                                        : at::empty({0}, at::kInt);
  const roicore_out_tensor o = OutView(out);
  Run([&](roicore_error* err) {
    return roicore_roi_pool_max_forward(&rules, &x.view, &b.view, spatial_scale, &o,
                                        need_argmax ? argmax.data_ptr() : nullptr, argmax_type,
                                        &exec, err);
  });
  return {Result(out, input), argmax};
}

at::Tensor RoiPoolBackwardCpu(const at::Tensor& grad, const at::Tensor& argmax_in,
                              const at::Tensor& rois, int64_t n, int64_t c, int64_t h,
                              int64_t w, std::optional<int64_t> n_threads) {
  const char* op = "roicore::roi_pool_backward";
  const auto& rules = MaxPoolRules();
  CheckFloat(op, grad, "grad");
  CheckFloat(op, rois, "rois");
  CheckImageShape(op, n, c, h, w);
  const Map g = ReadGrad(op, grad);
  const Boxes b = ReadRois(op, rois, n, g.view.dtype);
  CheckGradShape(op, g, b.view.k, c);
  TORCH_CHECK_VALUE(argmax_in.defined(), op, ": argmax is an undefined tensor");
  TORCH_CHECK_TYPE(at::isIntegralType(argmax_in.scalar_type(), /*includeBool=*/false), op,
                   ": argmax must have an integer dtype, got ",
                   DtypeText(argmax_in.scalar_type()));
  TORCH_CHECK_VALUE(argmax_in.sizes() == grad.sizes(), op,
                    ": argmax and grad must both have the forward output's shape (K, C, PH, "
                    "PW), got ", ShapeText(argmax_in.sizes()), " and ",
                    ShapeText(grad.sizes()));
  TORCH_CHECK_VALUE(argmax_in.device().is_cpu(), op, ": argmax is on ",
                    argmax_in.device().str(), "; roicore's operators compute on the CPU");
  // int32 and int64 as they are, other widths as int64; the values are the C library's to
  // check (-1, or a pixel of the entry's own plane)
  const at::ScalarType type = argmax_in.scalar_type();
  const at::Tensor argmax =
      (type == at::kInt || type == at::kLong ? argmax_in : argmax_in.to(at::kLong)).contiguous();
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor dx = Output({n, c, h, w}, g.data.scalar_type(), grad);
  const roicore_out_tensor d = OutView(dx);
  Run([&](roicore_error* err) {
    return roicore_roi_pool_max_backward(
        &rules, &g.view, argmax.data_ptr(),
        argmax.scalar_type() == at::kInt ? ROICORE_INT32 : ROICORE_INT64, &b.view, &d, &exec,
        err);
  });
  return Result(dx, grad);
}

at::Tensor RoiAlignCpu(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                       int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned,
                       std::optional<int64_t> n_threads) {
  const char* op = "roicore::roi_align";
  const auto& rules = RoiAlignRules();
  CheckFloat(op, input, "input");
  CheckFloat(op, rois, "rois");
  const Map x = ReadInput(op, input);
  CheckPooled(op, ph, pw);
  CheckScale(op, spatial_scale);
  CheckSamplingRatio(op, sampling_ratio);
  const Boxes b = ReadRois(op, rois, x.view.n, x.view.dtype);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor out = Output({b.view.k, x.view.c, ph, pw}, x.data.scalar_type(), input);
  const roicore_out_tensor o = OutView(out);
  Run([&](roicore_error* err) {
    return roicore_roi_align_forward(&rules, &x.view, &b.view, spatial_scale, sampling_ratio,
                                     aligned, &o, &exec, err);
  });
  return Result(out, input);
}

at::Tensor RoiAlignBackwardCpu(const at::Tensor& grad, const at::Tensor& rois,
                               double spatial_scale, int64_t n, int64_t c, int64_t h, int64_t w,
                               int64_t sampling_ratio, bool aligned,
                               std::optional<int64_t> n_threads) {
  const char* op = "roicore::roi_align_backward";
  const auto& rules = RoiAlignRules();
  CheckFloat(op, grad, "grad");
  CheckFloat(op, rois, "rois");
  CheckImageShape(op, n, c, h, w);
  const Map g = ReadGrad(op, grad);
  CheckScale(op, spatial_scale);
  CheckSamplingRatio(op, sampling_ratio);
  const Boxes b = ReadRois(op, rois, n, g.view.dtype);
  CheckGradShape(op, g, b.view.k, c);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor dx = Output({n, c, h, w}, g.data.scalar_type(), grad);
  const roicore_out_tensor d = OutView(dx);
  Run([&](roicore_error* err) {
    return roicore_roi_align_backward(&rules, &g.view, &b.view, spatial_scale, sampling_ratio,
                                      aligned, &d, &exec, err);
  });
  return Result(dx, grad);
}

at::Tensor PsRoiPoolCpu(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                        int64_t ph, int64_t pw, std::optional<int64_t> n_threads) {
  const char* op = "roicore::ps_roi_pool";
  const auto& rules = PsRoiPoolRules();
  CheckFloat(op, input, "input");
  CheckFloat(op, rois, "rois");
  const Map x = ReadInput(op, input);
  CheckPooled(op, ph, pw);
  const int64_t d = PsChannels(op, x.view.c, ph, pw, "input");
  CheckScale(op, spatial_scale);
  const Boxes b = ReadRois(op, rois, x.view.n, x.view.dtype);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor out = Output({b.view.k, d, ph, pw}, x.data.scalar_type(), input);
  const roicore_out_tensor o = OutView(out);
  Run([&](roicore_error* err) {
    return roicore_ps_roi_pool_forward(&rules, &x.view, &b.view, spatial_scale, ph, pw, &o,
                                       &exec, err);
  });
  return Result(out, input);
}

at::Tensor PsRoiPoolBackwardCpu(const at::Tensor& grad, const at::Tensor& rois,
                                double spatial_scale, int64_t n, int64_t c, int64_t h,
                                int64_t w, std::optional<int64_t> n_threads) {
  const char* op = "roicore::ps_roi_pool_backward";
  const auto& rules = PsRoiPoolRules();
  CheckFloat(op, grad, "grad");
  CheckFloat(op, rois, "rois");
  CheckImageShape(op, n, c, h, w);
  const Map g = ReadGrad(op, grad);
  const int64_t ph = g.view.h, pw = g.view.w;
  const int64_t d = PsChannels(op, c, ph, pw, "the input (channels)");
  CheckScale(op, spatial_scale);
  const Boxes b = ReadRois(op, rois, n, g.view.dtype);
  CheckGradShape(op, g, b.view.k, d);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor dx = Output({n, c, h, w}, g.data.scalar_type(), grad);
  const roicore_out_tensor o = OutView(dx);
  Run([&](roicore_error* err) {
    return roicore_ps_roi_pool_backward(&rules, &g.view, &b.view, spatial_scale, ph, pw, &o,
                                        &exec, err);
  });
  return Result(dx, grad);
}

at::Tensor PsRoiAlignCpu(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                         int64_t ph, int64_t pw, int64_t sampling_ratio,
                         std::optional<int64_t> n_threads) {
  const char* op = "roicore::ps_roi_align";
  const auto& rules = PsRoiAlignRules();
  CheckFloat(op, input, "input");
  CheckFloat(op, rois, "rois");
  const Map x = ReadInput(op, input);
  CheckPooled(op, ph, pw);
  const int64_t d = PsChannels(op, x.view.c, ph, pw, "input");
  CheckScale(op, spatial_scale);
  CheckSamplingRatio(op, sampling_ratio);
  const Boxes b = ReadRois(op, rois, x.view.n, x.view.dtype);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor out = Output({b.view.k, d, ph, pw}, x.data.scalar_type(), input);
  const roicore_out_tensor o = OutView(out);
  Run([&](roicore_error* err) {
    return roicore_ps_roi_align_forward(&rules, &x.view, &b.view, spatial_scale, sampling_ratio,
                                        &o, &exec, err);
  });
  return Result(out, input);
}

at::Tensor PsRoiAlignBackwardCpu(const at::Tensor& grad, const at::Tensor& rois,
                                 double spatial_scale, int64_t n, int64_t c, int64_t h,
                                 int64_t w, int64_t sampling_ratio,
                                 std::optional<int64_t> n_threads) {
  const char* op = "roicore::ps_roi_align_backward";
  const auto& rules = PsRoiAlignRules();
  CheckFloat(op, grad, "grad");
  CheckFloat(op, rois, "rois");
  CheckImageShape(op, n, c, h, w);
  const Map g = ReadGrad(op, grad);
  const int64_t d = PsChannels(op, c, g.view.h, g.view.w, "the input (channels)");
  CheckScale(op, spatial_scale);
  CheckSamplingRatio(op, sampling_ratio);
  const Boxes b = ReadRois(op, rois, n, g.view.dtype);
  CheckGradShape(op, g, b.view.k, d);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor dx = Output({n, c, h, w}, g.data.scalar_type(), grad);
  const roicore_out_tensor o = OutView(dx);
  Run([&](roicore_error* err) {
    return roicore_ps_roi_align_backward(&rules, &g.view, &b.view, spatial_scale,
                                         sampling_ratio, &o, &exec, err);
  });
  return Result(dx, grad);
}


// torchvision's MultiScaleRoIAlign: the maps of a pyramid, level first_level + i at
// spatial_scales[i], each box pooled from its level (aligned=False there; the op takes it).
struct Pyramid {
  std::vector<Map> maps;
  std::vector<roicore_tensor> views;
  roicore_pyramid view;
};

Pyramid ReadPyramid(const char* op, at::TensorList maps, at::ArrayRef<double> scales,
                    int64_t first_level, int64_t canonical_level, double canonical_size) {
  TORCH_CHECK_VALUE(!maps.empty() && maps.size() <= ROICORE_MAX_LEVELS, op,
                    ": features must hold 1 to ", ROICORE_MAX_LEVELS, " maps, got ",
                    maps.size());
  TORCH_CHECK_VALUE(scales.size() == maps.size(), op,
                    ": spatial_scales must have one scale per feature map: ", maps.size(),
                    " maps, got ", scales.size(), " scales");
  Pyramid p;
  for (size_t i = 0; i < maps.size(); ++i) {
    const std::string name = "features[" + std::to_string(i) + "]";
    p.maps.push_back(ReadMap(op, maps[i], name.c_str(), "[N, C, H, W]", "H >= 1 and W"));
    const roicore_tensor& v = p.maps.back().view;
    const roicore_tensor& v0 = p.maps.front().view;
    TORCH_CHECK_VALUE(v.n == v0.n && v.c == v0.c, op, ": ", name,
                      " must have the batch and channels of features[0] (", v0.n, ", ", v0.c,
                      "), got ", ShapeText(maps[i].sizes()));
    TORCH_CHECK_TYPE(maps[i].scalar_type() == maps[0].scalar_type(), op, ": ", name,
                     " must have the dtype of features[0], ", DtypeText(maps[0].scalar_type()),
                     ", got ", DtypeText(maps[i].scalar_type()));
    p.views.push_back(v);
  }
  for (double scale : scales) CheckScale(op, scale);
  p.view = roicore_pyramid{};
  p.view.n_levels = static_cast<int64_t>(maps.size());
  p.view.first_level = first_level;
  p.view.canonical_level = canonical_level;
  p.view.canonical_size = canonical_size;
  p.view.spatial_scales = scales.data();
  return p;
}

at::Tensor MultiScaleRoiAlignCpu(at::TensorList maps, const at::Tensor& rois,
                                 at::ArrayRef<double> spatial_scales, int64_t ph, int64_t pw,
                                 int64_t sampling_ratio, bool aligned, int64_t first_level,
                                 int64_t canonical_level, double canonical_size,
                                 std::optional<int64_t> n_threads) {
  const char* op = "roicore::multi_scale_roi_align";
  CheckFloat(op, rois, "rois");
  const Pyramid p =
      ReadPyramid(op, maps, spatial_scales, first_level, canonical_level, canonical_size);
  CheckPooled(op, ph, pw);
  CheckSamplingRatio(op, sampling_ratio);
  const roicore_tensor& x = p.views.front();
  const Boxes b = ReadRois(op, rois, x.n, x.dtype);
  const roicore_exec exec = Exec(op, n_threads);
  const at::Tensor out = Output({b.view.k, x.c, ph, pw}, p.maps.front().data.scalar_type(),
                                maps[0]);
  const roicore_out_tensor o = OutView(out);
  Run([&](roicore_error* err) {
    return roicore_pyramid_roi_align_forward(&RoiAlignRules(), &LevelRules(), &p.view,
                                             p.views.data(), &b.view, sampling_ratio, aligned,
                                             &o, &exec, err);
  });
  return Result(out, maps[0]);
}

std::vector<at::Tensor> MultiScaleRoiAlignBackwardCpu(
    const at::Tensor& grad, const at::Tensor& rois, at::ArrayRef<double> spatial_scales,
    at::IntArrayRef input_shapes, int64_t sampling_ratio, bool aligned, int64_t first_level,
    int64_t canonical_level, double canonical_size, std::optional<int64_t> n_threads) {
  const char* op = "roicore::multi_scale_roi_align_backward";
  CheckFloat(op, grad, "grad");
  CheckFloat(op, rois, "rois");
  const size_t levels = spatial_scales.size();
  TORCH_CHECK_VALUE(levels >= 1 && levels <= ROICORE_MAX_LEVELS, op,
                    ": spatial_scales must hold 1 to ", ROICORE_MAX_LEVELS, " scales, got ",
                    levels);
  TORCH_CHECK_VALUE(input_shapes.size() == 4 * levels, op,
                    ": input_shapes must hold (batch_size, channels, height, width) of each of "
                    "the ", levels, " maps, got ", input_shapes.size(), " values");
  for (size_t i = 0; i < levels; ++i) {
    const int64_t* s = input_shapes.data() + 4 * i;
    CheckImageShape(op, s[0], s[1], s[2], s[3]);
    TORCH_CHECK_VALUE(s[0] == input_shapes[0] && s[1] == input_shapes[1], op,
                      ": every map must have the batch and channels of the first, got (",
                      s[0], ", ", s[1], ") for map ", i);
  }
  for (double scale : spatial_scales) CheckScale(op, scale);
  CheckSamplingRatio(op, sampling_ratio);
  const Map g = ReadGrad(op, grad);
  const Boxes b = ReadRois(op, rois, input_shapes[0], g.view.dtype);
  CheckGradShape(op, g, b.view.k, input_shapes[1]);
  const roicore_exec exec = Exec(op, n_threads);
  // every gradient map checked against the memory limit together, then allocated
  const at::ScalarType type = g.data.scalar_type();
  int64_t bytes = 0;
  for (size_t i = 0; i < levels; ++i) {
    const at::IntArrayRef shape = input_shapes.slice(4 * i, 4);
    bytes = AddBytes(bytes, Bytes(shape, type));
    if (grad.scalar_type() != type) bytes = AddBytes(bytes, Bytes(shape, grad.scalar_type()));
  }
  Run([&](roicore_error* err) {
    return roicore_check_allocation(bytes, "the gradients of the feature maps", err);
  });
  std::vector<at::Tensor> dx;
  std::vector<roicore_out_tensor> views;
  for (size_t i = 0; i < levels; ++i) {
    dx.push_back(at::empty(input_shapes.slice(4 * i, 4), at::TensorOptions().dtype(type)));
    views.push_back(OutView(dx.back()));
  }
  roicore_pyramid p{};
  p.n_levels = static_cast<int64_t>(levels);
  p.first_level = first_level;
  p.canonical_level = canonical_level;
  p.canonical_size = canonical_size;
  p.spatial_scales = spatial_scales.data();
  Run([&](roicore_error* err) {
    return roicore_pyramid_roi_align_backward(&RoiAlignRules(), &LevelRules(), &p, &g.view,
                                              &b.view, sampling_ratio, aligned, views.data(),
                                              &exec, err);
  });
  for (auto& d : dx) d = Result(d, grad);
  return dx;
}

// ------------------------------------------------------------------------------------
// The registered ops, called through the dispatcher (from the autograd and autocast
// kernels, with SymInt sizes: they run under torch.compile's fake tensors too)

using SymInt = c10::SymInt;
using OptSymInt = std::optional<c10::SymInt>;

template <typename Signature>
c10::TypedOperatorHandle<Signature> Handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

#define ROICORE_OP(fn, name, signature)                                  \
  const c10::TypedOperatorHandle<signature>& fn() {                     \
    static const auto handle = Handle<signature>("roicore::" name);     \
    return handle;                                                      \
  }

using RoiPoolSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, double, SymInt, SymInt, bool, OptSymInt);
using RoiPoolBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&, SymInt, SymInt, SymInt, SymInt,
                                            OptSymInt);
using RoiAlignSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double, SymInt,
                                     SymInt, SymInt, bool, OptSymInt);
using RoiAlignBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                             SymInt, SymInt, SymInt, SymInt, SymInt, bool,
                                             OptSymInt);
using PsRoiPoolSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double, SymInt,
                                      SymInt, OptSymInt);
using PsRoiPoolBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                              SymInt, SymInt, SymInt, SymInt, OptSymInt);
using PsRoiAlignSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double, SymInt,
                                       SymInt, SymInt, OptSymInt);
using PsRoiAlignBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                               SymInt, SymInt, SymInt, SymInt, SymInt,
                                               OptSymInt);

ROICORE_OP(RoiPoolOp, "roi_pool", RoiPoolSignature)
ROICORE_OP(RoiPoolBackwardOp, "roi_pool_backward", RoiPoolBackwardSignature)
ROICORE_OP(RoiAlignOp, "roi_align", RoiAlignSignature)
ROICORE_OP(RoiAlignBackwardOp, "roi_align_backward", RoiAlignBackwardSignature)
ROICORE_OP(PsRoiPoolOp, "ps_roi_pool", PsRoiPoolSignature)
ROICORE_OP(PsRoiPoolBackwardOp, "ps_roi_pool_backward", PsRoiPoolBackwardSignature)
ROICORE_OP(PsRoiAlignOp, "ps_roi_align", PsRoiAlignSignature)
ROICORE_OP(PsRoiAlignBackwardOp, "ps_roi_align_backward", PsRoiAlignBackwardSignature)
using MultiScaleRoiAlignSignature = at::Tensor(at::TensorList, const at::Tensor&,
                                               at::ArrayRef<double>, SymInt, SymInt, SymInt,
                                               bool, SymInt, SymInt, double, OptSymInt);
using MultiScaleRoiAlignBackwardSignature = std::vector<at::Tensor>(
    const at::Tensor&, const at::Tensor&, at::ArrayRef<double>, c10::SymIntArrayRef, SymInt,
    bool, SymInt, SymInt, double, OptSymInt);
ROICORE_OP(MultiScaleRoiAlignOp, "multi_scale_roi_align", MultiScaleRoiAlignSignature)
ROICORE_OP(MultiScaleRoiAlignBackwardOp, "multi_scale_roi_align_backward",
           MultiScaleRoiAlignBackwardSignature)
#undef ROICORE_OP

// ------------------------------------------------------------------------------------
// Autograd: the gradient with respect to input (rois gets none, as in torchvision); a
// gradient of a gradient is refused, as there

// What a backward needs of its forward besides tensors: saved_data entries.
void SaveShape(AutogradContext* ctx, const at::Tensor& input) {
  const auto sizes = input.sym_sizes();
  ctx->saved_data["n"] = sizes[0];
  ctx->saved_data["c"] = sizes[1];
  ctx->saved_data["h"] = sizes[2];
  ctx->saved_data["w"] = sizes[3];
}

SymInt Saved(AutogradContext* ctx, const char* name) { return ctx->saved_data[name].toSymInt(); }

void SaveThreads(AutogradContext* ctx, const OptSymInt& n_threads) {
  ctx->saved_data["has_n_threads"] = n_threads.has_value();
  if (n_threads.has_value()) ctx->saved_data["n_threads"] = *n_threads;
}

OptSymInt SavedThreads(AutogradContext* ctx) {
  if (!ctx->saved_data["has_n_threads"].toBool()) return std::nullopt;
  return ctx->saved_data["n_threads"].toSymInt();
}

class RoiPoolFunction : public torch::autograd::Function<RoiPoolFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale, SymInt ph,
                               SymInt pw, bool need_argmax, OptSymInt n_threads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, argmax] =
        RoiPoolOp().call(input, rois, spatial_scale, ph, pw, need_argmax, n_threads);
    // a caller that asked for no argmax and then for a gradient gets the argmax recomputed
    // from the input (the adapter's functions ask for it whenever a gradient may follow)
    ctx->save_for_backward({rois, argmax, need_argmax ? at::Tensor() : input});
    ctx->mark_non_differentiable({argmax});
    // else autograd hands the backward a zero "gradient" of the argmax, as large as it is
    ctx->set_materialize_grads(false);
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["ph"] = ph;
    ctx->saved_data["pw"] = pw;
    ctx->saved_data["need_argmax"] = need_argmax;
    SaveShape(ctx, input);
    SaveThreads(ctx, n_threads);
    return {out, argmax};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(7);
    if (!grads[0].defined()) return result;  // the output itself received no gradient
    const auto saved = ctx->get_saved_variables();
    const OptSymInt n_threads = SavedThreads(ctx);
    at::Tensor argmax = saved[1];
    if (!ctx->saved_data["need_argmax"].toBool()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      argmax = std::get<1>(RoiPoolOp().call(saved[2], saved[0],
                                            ctx->saved_data["spatial_scale"].toDouble(),
                                            Saved(ctx, "ph"), Saved(ctx, "pw"), true, n_threads));
    }
    result[0] = RoiPoolBackwardOp().call(grads[0], argmax, saved[0], Saved(ctx, "n"),
                                         Saved(ctx, "c"), Saved(ctx, "h"), Saved(ctx, "w"),
                                         n_threads);
    return result;
  }
};

class RoiAlignFunction : public torch::autograd::Function<RoiAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale, SymInt ph,
                               SymInt pw, SymInt sampling_ratio, bool aligned,
                               OptSymInt n_threads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out = RoiAlignOp().call(input, rois, spatial_scale, ph, pw, sampling_ratio,
                                       aligned, n_threads);
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["sampling_ratio"] = sampling_ratio;
    ctx->saved_data["aligned"] = aligned;
    SaveShape(ctx, input);
    SaveThreads(ctx, n_threads);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(8);
    result[0] = RoiAlignBackwardOp().call(
        grads[0], ctx->get_saved_variables()[0], ctx->saved_data["spatial_scale"].toDouble(),
        Saved(ctx, "n"), Saved(ctx, "c"), Saved(ctx, "h"), Saved(ctx, "w"),
        Saved(ctx, "sampling_ratio"), ctx->saved_data["aligned"].toBool(), SavedThreads(ctx));
    return result;
  }
};

class PsRoiPoolFunction : public torch::autograd::Function<PsRoiPoolFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale, SymInt ph,
                               SymInt pw, OptSymInt n_threads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out = PsRoiPoolOp().call(input, rois, spatial_scale, ph, pw, n_threads);
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scale"] = spatial_scale;
    SaveShape(ctx, input);
    SaveThreads(ctx, n_threads);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(6);
    result[0] = PsRoiPoolBackwardOp().call(
        grads[0], ctx->get_saved_variables()[0], ctx->saved_data["spatial_scale"].toDouble(),
        Saved(ctx, "n"), Saved(ctx, "c"), Saved(ctx, "h"), Saved(ctx, "w"), SavedThreads(ctx));
    return result;
  }
};

class PsRoiAlignFunction : public torch::autograd::Function<PsRoiAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale, SymInt ph,
                               SymInt pw, SymInt sampling_ratio, OptSymInt n_threads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out =
        PsRoiAlignOp().call(input, rois, spatial_scale, ph, pw, sampling_ratio, n_threads);
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["sampling_ratio"] = sampling_ratio;
    SaveShape(ctx, input);
    SaveThreads(ctx, n_threads);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(7);
    result[0] = PsRoiAlignBackwardOp().call(
        grads[0], ctx->get_saved_variables()[0], ctx->saved_data["spatial_scale"].toDouble(),
        Saved(ctx, "n"), Saved(ctx, "c"), Saved(ctx, "h"), Saved(ctx, "w"),
        Saved(ctx, "sampling_ratio"), SavedThreads(ctx));
    return result;
  }
};

// A gradient op under autograd: it runs, and differentiating it again is refused.
template <typename Op>
class RefuseDoubleBackward : public torch::autograd::Function<RefuseDoubleBackward<Op>> {
 public:
  template <typename... Args>
  static variable_list forward(AutogradContext* ctx, Args... args) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return {Op::handle().call(args...)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(false, Op::name, ": double backward is not supported (as in torchvision)");
    return {};
  }
};

#define ROICORE_BACKWARD_OP(Tag, op_fn, op_name)                                  \
  struct Tag {                                                                    \
    static constexpr const char* name = "roicore::" op_name;                      \
    static const auto& handle() { return op_fn(); }                               \
  };

ROICORE_BACKWARD_OP(RoiPoolBackwardTag, RoiPoolBackwardOp, "roi_pool_backward")
ROICORE_BACKWARD_OP(RoiAlignBackwardTag, RoiAlignBackwardOp, "roi_align_backward")
ROICORE_BACKWARD_OP(PsRoiPoolBackwardTag, PsRoiPoolBackwardOp, "ps_roi_pool_backward")
ROICORE_BACKWARD_OP(PsRoiAlignBackwardTag, PsRoiAlignBackwardOp, "ps_roi_align_backward")
#undef ROICORE_BACKWARD_OP

std::tuple<at::Tensor, at::Tensor> RoiPoolAutograd(const at::Tensor& input,
                                                   const at::Tensor& rois,
                                                   double spatial_scale, SymInt ph, SymInt pw,
                                                   bool need_argmax, OptSymInt n_threads) {
  const auto r = RoiPoolFunction::apply(input, rois, spatial_scale, ph, pw, need_argmax,
                                        n_threads);
  return {r[0], r[1]};
}

at::Tensor RoiPoolBackwardAutograd(const at::Tensor& grad, const at::Tensor& argmax,
                                   const at::Tensor& rois, SymInt n, SymInt c, SymInt h,
                                   SymInt w, OptSymInt n_threads) {
  return RefuseDoubleBackward<RoiPoolBackwardTag>::apply(grad, argmax, rois, n, c, h, w,
                                                         n_threads)[0];
}

at::Tensor RoiAlignAutograd(const at::Tensor& input, const at::Tensor& rois,
                            double spatial_scale, SymInt ph, SymInt pw, SymInt sampling_ratio,
                            bool aligned, OptSymInt n_threads) {
  return RoiAlignFunction::apply(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned,
                                 n_threads)[0];
}

at::Tensor RoiAlignBackwardAutograd(const at::Tensor& grad, const at::Tensor& rois,
                                    double spatial_scale, SymInt n, SymInt c, SymInt h,
                                    SymInt w, SymInt sampling_ratio, bool aligned,
                                    OptSymInt n_threads) {
  return RefuseDoubleBackward<RoiAlignBackwardTag>::apply(
      grad, rois, spatial_scale, n, c, h, w, sampling_ratio, aligned, n_threads)[0];
}

at::Tensor PsRoiPoolAutograd(const at::Tensor& input, const at::Tensor& rois,
                             double spatial_scale, SymInt ph, SymInt pw, OptSymInt n_threads) {
  return PsRoiPoolFunction::apply(input, rois, spatial_scale, ph, pw, n_threads)[0];
}

at::Tensor PsRoiPoolBackwardAutograd(const at::Tensor& grad, const at::Tensor& rois,
                                     double spatial_scale, SymInt n, SymInt c, SymInt h,
                                     SymInt w, OptSymInt n_threads) {
  return RefuseDoubleBackward<PsRoiPoolBackwardTag>::apply(grad, rois, spatial_scale, n, c, h,
                                                           w, n_threads)[0];
}

at::Tensor PsRoiAlignAutograd(const at::Tensor& input, const at::Tensor& rois,
                              double spatial_scale, SymInt ph, SymInt pw, SymInt sampling_ratio,
                              OptSymInt n_threads) {
  return PsRoiAlignFunction::apply(input, rois, spatial_scale, ph, pw, sampling_ratio,
                                   n_threads)[0];
}

at::Tensor PsRoiAlignBackwardAutograd(const at::Tensor& grad, const at::Tensor& rois,
                                      double spatial_scale, SymInt n, SymInt c, SymInt h,
                                      SymInt w, SymInt sampling_ratio, OptSymInt n_threads) {
  return RefuseDoubleBackward<PsRoiAlignBackwardTag>::apply(grad, rois, spatial_scale, n, c, h,
                                                            w, sampling_ratio, n_threads)[0];
}


class MultiScaleRoiAlignFunction : public torch::autograd::Function<MultiScaleRoiAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList maps, const at::Tensor& rois,
                               at::ArrayRef<double> spatial_scales, SymInt ph, SymInt pw,
                               SymInt sampling_ratio, bool aligned, SymInt first_level,
                               SymInt canonical_level, double canonical_size,
                               OptSymInt n_threads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out = MultiScaleRoiAlignOp().call(maps, rois, spatial_scales, ph, pw,
                                                 sampling_ratio, aligned, first_level,
                                                 canonical_level, canonical_size, n_threads);
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scales"] = spatial_scales.vec();
    ctx->saved_data["levels"] = static_cast<int64_t>(maps.size());
    for (size_t i = 0; i < maps.size(); ++i) {
      const auto sizes = maps[i].sym_sizes();
      for (size_t d = 0; d < 4; ++d) ctx->saved_data["shape" + std::to_string(4 * i + d)] = sizes[d];
    }
    ctx->saved_data["sampling_ratio"] = sampling_ratio;
    ctx->saved_data["aligned"] = aligned;
    ctx->saved_data["first_level"] = first_level;
    ctx->saved_data["canonical_level"] = canonical_level;
    ctx->saved_data["canonical_size"] = canonical_size;
    SaveThreads(ctx, n_threads);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t levels = ctx->saved_data["levels"].toInt();
    std::vector<SymInt> shapes;
    for (int64_t i = 0; i < 4 * levels; ++i) shapes.push_back(Saved(ctx, ("shape" + std::to_string(i)).c_str()));
    const std::vector<double> scales = ctx->saved_data["spatial_scales"].toDoubleVector();
    std::vector<at::Tensor> dx = MultiScaleRoiAlignBackwardOp().call(
        grads[0], ctx->get_saved_variables()[0], scales, shapes, Saved(ctx, "sampling_ratio"),
        ctx->saved_data["aligned"].toBool(), Saved(ctx, "first_level"),
        Saved(ctx, "canonical_level"), ctx->saved_data["canonical_size"].toDouble(),
        SavedThreads(ctx));
    // one gradient per map, then none for the other ten arguments
    variable_list result(dx.begin(), dx.end());
    result.resize(dx.size() + 10);
    return result;
  }
};

// The gradient op under autograd: it runs, and differentiating it again is refused.
class MultiScaleRoiAlignBackwardFunction
    : public torch::autograd::Function<MultiScaleRoiAlignBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad,
                               const at::Tensor& rois, at::ArrayRef<double> spatial_scales,
                               c10::SymIntArrayRef input_shapes, SymInt sampling_ratio,
                               bool aligned, SymInt first_level, SymInt canonical_level,
                               double canonical_size, OptSymInt n_threads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return MultiScaleRoiAlignBackwardOp().call(grad, rois, spatial_scales, input_shapes,
                                               sampling_ratio, aligned, first_level,
                                               canonical_level, canonical_size, n_threads);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(false, "roicore::multi_scale_roi_align_backward: double backward is not "
                       "supported (as in torchvision)");
    return {};
  }
};

at::Tensor MultiScaleRoiAlignAutograd(at::TensorList maps, const at::Tensor& rois,
                                      at::ArrayRef<double> spatial_scales, SymInt ph, SymInt pw,
                                      SymInt sampling_ratio, bool aligned, SymInt first_level,
                                      SymInt canonical_level, double canonical_size,
                                      OptSymInt n_threads) {
  return MultiScaleRoiAlignFunction::apply(maps, rois, spatial_scales, ph, pw, sampling_ratio,
                                           aligned, first_level, canonical_level,
                                           canonical_size, n_threads)[0];
}

std::vector<at::Tensor> MultiScaleRoiAlignBackwardAutograd(
    const at::Tensor& grad, const at::Tensor& rois, at::ArrayRef<double> spatial_scales,
    c10::SymIntArrayRef input_shapes, SymInt sampling_ratio, bool aligned, SymInt first_level,
    SymInt canonical_level, double canonical_size, OptSymInt n_threads) {
  return MultiScaleRoiAlignBackwardFunction::apply(grad, rois, spatial_scales, input_shapes,
                                                   sampling_ratio, aligned, first_level,
                                                   canonical_level, canonical_size, n_threads);
}

// ------------------------------------------------------------------------------------
// Autocast: torchvision's rule for roi_align on the CPU (input and rois in float32, the
// result in input's dtype; float64 stays float64).  The other ops are not autocast, there
// as here.

at::Tensor RoiAlignAutocast(const at::Tensor& input, const at::Tensor& rois,
                            double spatial_scale, SymInt ph, SymInt pw, SymInt sampling_ratio,
                            bool aligned, OptSymInt n_threads) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return RoiAlignOp()
      .call(at::autocast::cached_cast(at::kFloat, input, c10::DeviceType::CPU),
            at::autocast::cached_cast(at::kFloat, rois, c10::DeviceType::CPU), spatial_scale,
            ph, pw, sampling_ratio, aligned, n_threads)
      .to(input.scalar_type());
}

}  // namespace
}  // namespace roicore_torch

// ------------------------------------------------------------------------------------
// Registrations

TORCH_LIBRARY(roicore, m) {
  // the ops' fake (meta) implementations are registered in Python by this module, which
  // torch.compile and torch.export ask for when they meet an op without one
  m.set_python_module("roicore.adapters.torch");
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, bool need_argmax, SymInt? n_threads) -> (Tensor, Tensor)",
        tags);
  m.def("roi_pool_backward(Tensor grad, Tensor argmax, Tensor rois, SymInt batch_size, "
        "SymInt channels, SymInt height, SymInt width, SymInt? n_threads) -> Tensor",
        tags);
  m.def("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, SymInt sampling_ratio, bool aligned, SymInt? n_threads) -> "
        "Tensor",
        tags);
  m.def("roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt "
        "batch_size, SymInt channels, SymInt height, SymInt width, SymInt sampling_ratio, "
        "bool aligned, SymInt? n_threads) -> Tensor",
        tags);
  m.def("ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, SymInt? n_threads) -> Tensor",
        tags);
  m.def("ps_roi_pool_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt "
        "batch_size, SymInt channels, SymInt height, SymInt width, SymInt? n_threads) -> "
        "Tensor",
        tags);
  m.def("ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, SymInt sampling_ratio, SymInt? n_threads) -> Tensor",
        tags);
  m.def("ps_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt "
        "batch_size, SymInt channels, SymInt height, SymInt width, SymInt sampling_ratio, "
        "SymInt? n_threads) -> Tensor",
        tags);
  m.def("multi_scale_roi_align(Tensor[] maps, Tensor rois, float[] spatial_scales, SymInt "
        "pooled_height, SymInt pooled_width, SymInt sampling_ratio, bool aligned, SymInt "
        "first_level, SymInt canonical_level, float canonical_size, SymInt? n_threads) -> "
        "Tensor",
        tags);
  m.def("multi_scale_roi_align_backward(Tensor grad, Tensor rois, float[] spatial_scales, "
        "SymInt[] input_shapes, SymInt sampling_ratio, bool aligned, SymInt first_level, "
        "SymInt canonical_level, float canonical_size, SymInt? n_threads) -> Tensor[]",
        tags);
}

TORCH_LIBRARY_IMPL(roicore, CPU, m) {
  using namespace roicore_torch;
  m.impl("roi_pool", TORCH_FN(RoiPoolCpu));
  m.impl("roi_pool_backward", TORCH_FN(RoiPoolBackwardCpu));
  m.impl("roi_align", TORCH_FN(RoiAlignCpu));
  m.impl("roi_align_backward", TORCH_FN(RoiAlignBackwardCpu));
  m.impl("ps_roi_pool", TORCH_FN(PsRoiPoolCpu));
  m.impl("ps_roi_pool_backward", TORCH_FN(PsRoiPoolBackwardCpu));
  m.impl("ps_roi_align", TORCH_FN(PsRoiAlignCpu));
  m.impl("ps_roi_align_backward", TORCH_FN(PsRoiAlignBackwardCpu));
  m.impl("multi_scale_roi_align", TORCH_FN(MultiScaleRoiAlignCpu));
  m.impl("multi_scale_roi_align_backward", TORCH_FN(MultiScaleRoiAlignBackwardCpu));
}

TORCH_LIBRARY_IMPL(roicore, Autograd, m) {
  using namespace roicore_torch;
  m.impl("roi_pool", TORCH_FN(RoiPoolAutograd));
  m.impl("roi_pool_backward", TORCH_FN(RoiPoolBackwardAutograd));
  m.impl("roi_align", TORCH_FN(RoiAlignAutograd));
  m.impl("roi_align_backward", TORCH_FN(RoiAlignBackwardAutograd));
  m.impl("ps_roi_pool", TORCH_FN(PsRoiPoolAutograd));
  m.impl("ps_roi_pool_backward", TORCH_FN(PsRoiPoolBackwardAutograd));
  m.impl("ps_roi_align", TORCH_FN(PsRoiAlignAutograd));
  m.impl("ps_roi_align_backward", TORCH_FN(PsRoiAlignBackwardAutograd));
  m.impl("multi_scale_roi_align", TORCH_FN(MultiScaleRoiAlignAutograd));
  m.impl("multi_scale_roi_align_backward", TORCH_FN(MultiScaleRoiAlignBackwardAutograd));
}

TORCH_LIBRARY_IMPL(roicore, AutocastCPU, m) {
  m.impl("roi_align", TORCH_FN(roicore_torch::RoiAlignAutocast));
}
