// roicore's RoI operators as Paddle custom operators (paddle.utils.cpp_extension).
//
// roicore_roi_pool, roicore_psroi_pool and roicore_roi_align, each with its gradient op,
// shape and dtype inference, computed by roicore's C library.  Registered operators are
// what Paddle records into static programs and what paddle.jit.save writes out, so a
// model that uses them can be traced, saved, reloaded and served like any other.
//
// Every attribute and tensor is checked here or by the C API before any kernel runs: a
// wrong input raises Paddle's ValueError (InvalidArgument) with roicore's message, never
// a crash.  Shape inference does not throw (an exception there aborts Paddle's program
// builder); whatever it cannot check, the kernel checks when it runs.
//
// Attributes common to the three ops:
//   rules          the convention's fields in declaration order (roicore_*_rules_from_array)
//   pooled_height, pooled_width
//   spatial_scale  a C float, as Paddle's own ops hold it
//   n_threads      OpenMP threads (0: OMP_NUM_THREADS or every CPU; see roicore.h)

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "paddle/extension.h"
#include "paddle/phi/core/dense_tensor.h"
#include "roicore.h"

namespace phi {
namespace funcs {
// Exported by Paddle's phi library when it is built with oneDNN (as the CPU wheels are);
// declared here so that no oneDNN header is needed.
PADDLE_API void TransDataLayoutFromOneDNN(DataLayout in_layout, DataLayout out_layout,
                                          const DenseTensor& in, DenseTensor* out,
                                          Place place, bool always_copy);
}  // namespace funcs
}  // namespace phi

// The one symbol this library exports besides the framework's registrations: it points
// the library's copy of roicore's C library at the runtime of roicore.core's (memory
// limit, kept scratch, Ctrl-C; see roicore.h), which roicore.adapters does right after
// loading it.  0 when shared, else the C API's status.
extern "C" __attribute__((visibility("default"))) int roicore_native_share_runtime(
    void* runtime) {
  return roicore_runtime_share(static_cast<roicore_runtime*>(runtime), nullptr);
}

namespace {

// ------------------------------------------------------------------------ errors

[[noreturn]] void fail(common::ErrorCode code, const std::string& op, const std::string& msg) {
  throw common::enforce::EnforceNotMet(common::ErrorSummary(code, op + ": " + msg), __FILE__,
                                       __LINE__);
}

[[noreturn]] void invalid(const std::string& op, const std::string& msg) {
  fail(common::ErrorCode::INVALID_ARGUMENT, op, msg);
}

// A failed C API call as Paddle's error of the matching kind, with roicore's message.
void check(int status, const roicore_error& err, const std::string& op) {
  switch (status) {
    case ROICORE_OK:
      return;
    case ROICORE_ERR_MEMORY:
      fail(common::ErrorCode::RESOURCE_EXHAUSTED, op, err.message);
    case ROICORE_ERR_UNSUPPORTED:
      fail(common::ErrorCode::UNIMPLEMENTED, op, err.message);
    case ROICORE_ERR_INTERRUPTED:  // Ctrl-C (Python raises its KeyboardInterrupt after it)
      fail(common::ErrorCode::UNAVAILABLE, op, err.message);
    default:  // ARGUMENT, VALUE
      invalid(op, err.message);
  }
}

// Runs `c_call(&err)`, a C API call, raising its error.
template <typename F>
void call(const std::string& op, F&& c_call) {
  roicore_error err;
  check(c_call(&err), err, op);
}

// ------------------------------------------------------------------------ tensors

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string dtype_text(paddle::DataType t) { return phi::DataTypeToString(t); }

// `t` as a dense row-major host tensor.  Inference programs hand a custom op the output
// of a oneDNN kernel in oneDNN's blocked layout unchanged (Paddle converts it only for its
// own kernels), so that layout is converted to plain NCHW here; strided views are made
// contiguous.
paddle::Tensor dense_host(const paddle::Tensor& t, const char* name, const std::string& op) {
  if (t.numel() > 0 && !t.initialized()) invalid(op, std::string(name) + " holds no data");
  if (t.place() != paddle::CPUPlace())
    invalid(op, std::string(name) + " is on " + t.place().DebugString() +
                    "; roicore's Paddle operators compute on the CPU, so move the inputs "
                    "there");
  if (t.layout() == phi::DataLayout::ONEDNN) {
    auto plain = std::make_shared<phi::DenseTensor>();
    phi::funcs::TransDataLayoutFromOneDNN(phi::DataLayout::ONEDNN, phi::DataLayout::NCHW,
                                          *std::static_pointer_cast<phi::DenseTensor>(t.impl()),
                                          plain.get(), phi::CPUPlace(), true);
    return paddle::Tensor(plain);
  }
  return t.is_contiguous() ? t : t.contiguous();
}

roicore_dtype float_dtype(const paddle::Tensor& t, const char* name, const std::string& op) {
  if (t.dtype() == paddle::DataType::FLOAT32) return ROICORE_FLOAT32;
  if (t.dtype() == paddle::DataType::FLOAT64) return ROICORE_FLOAT64;
  invalid(op, std::string(name) + " must be float32 or float64, got " + dtype_text(t.dtype()));
}

// A 4-D dense host tensor as the C API's NCHW tensor: one a call reads, or (out) writes.
template <typename Described, typename Data>
Described described(Data data, const std::vector<int64_t>& d, roicore_dtype dtype) {
  Described t{};
  t.data = data;
  t.dtype = dtype;
  t.layout = ROICORE_NCHW;
  t.n = d[0], t.c = d[1], t.h = d[2], t.w = d[3];
  return t;
}

roicore_tensor view(const paddle::Tensor& t, roicore_dtype dtype) {
  return described<roicore_tensor>(t.data(), t.shape(), dtype);
}

roicore_out_tensor out_view(paddle::Tensor& t, roicore_dtype dtype) {
  return described<roicore_out_tensor>(t.data(), t.shape(), dtype);
}

roicore_tensor nchw(const paddle::Tensor& t, roicore_dtype dtype, const char* name,
                    const std::string& op) {
  if (t.shape().size() != 4)
    invalid(op, std::string(name) + " must be a 4-D [N, C, H, W] tensor, got shape " +
                    dims_text(t.shape()));
  return view(t, dtype);
}

// The checked inputs of one call: x (or the forward's x for a gradient), its boxes and
// the image of each box from boxes_num.
struct Inputs {
  paddle::Tensor x, boxes;
  roicore_tensor tx;
  std::vector<int64_t> batch;
  roicore_boxes rb;
};

Inputs inputs(const paddle::Tensor& x_in, const paddle::Tensor& boxes_in,
              const paddle::Tensor& boxes_num_in, const std::string& op) {
  Inputs in;
  in.x = dense_host(x_in, "x", op);
  const roicore_dtype dtype = float_dtype(in.x, "x", op);
  in.tx = nchw(in.x, dtype, "x", op);
  in.boxes = dense_host(boxes_in, "boxes", op);
  const auto bd = in.boxes.shape();
  if (bd.size() != 2 || bd[1] != 4)
    invalid(op, "boxes must be a 2-D [num_boxes, 4] tensor of [x1, y1, x2, y2] rows, got "
                "shape " + dims_text(bd));
  if (in.boxes.dtype() != in.x.dtype())
    invalid(op, "boxes must have the dtype of x (" + dtype_text(in.x.dtype()) + "), got " +
                    dtype_text(in.boxes.dtype()));
  const paddle::Tensor counts = dense_host(boxes_num_in, "boxes_num", op);
  roicore_index_type count_type;
  if (counts.dtype() == paddle::DataType::INT32) {
    count_type = ROICORE_INT32;
  } else if (counts.dtype() == paddle::DataType::INT64) {
    count_type = ROICORE_INT64;
  } else {
    invalid(op, "boxes_num must be int32 or int64, got " + dtype_text(counts.dtype()));
  }
  if (counts.shape().size() != 1)
    invalid(op, "boxes_num must be 1-D (one count per image), got shape " +
                    dims_text(counts.shape()));
  if (counts.shape()[0] != in.tx.n)
    invalid(op, "boxes_num must have one count per image (N=" + std::to_string(in.tx.n) +
                    "), got " + std::to_string(counts.shape()[0]));
  in.batch.resize(static_cast<size_t>(bd[0]));
  call(op, [&](roicore_error* err) {
    return roicore_batch_from_counts(counts.data(), count_type, in.tx.n, bd[0], "boxes_num",
                                     in.batch.data(), err);
  });
  in.rb = roicore_boxes{};
  in.rb.coords = in.boxes.data();
  in.rb.batch = in.batch.data();
  in.rb.k = bd[0];
  return in;
}

// The rules attribute decoded by `from_array` (a roicore_*_rules_from_array).
template <typename Rules>
Rules decode(roicore_status (*from_array)(const int64_t*, int64_t, Rules*, roicore_error*),
             const std::vector<int>& rules, const std::string& op) {
  const std::vector<int64_t> fields(rules.begin(), rules.end());
  Rules r;
  call(op, [&](roicore_error* err) {
    return from_array(fields.data(), static_cast<int64_t>(fields.size()), &r, err);
  });
  return r;
}

roicore_exec exec_of(int n_threads) {
  roicore_exec exec{};
  exec.n_threads = n_threads;
  return exec;
}

// An output of `dims` and `dtype`, checked against roicore's memory limit first (sizes
// that overflow included: paddle::empty would not survive them).
paddle::Tensor output(const std::vector<int64_t>& dims, paddle::DataType dtype,
                      const std::string& op) {
  int64_t bytes = dtype == paddle::DataType::FLOAT64 || dtype == paddle::DataType::INT64 ? 8 : 4;
  for (int64_t d : dims) bytes = roicore_mul(bytes, d);
  const std::string what = "the output of shape " + dims_text(dims);
  call(op, [&](roicore_error* err) { return roicore_check_allocation(bytes, what.c_str(), err); });
  return paddle::empty(dims, dtype, paddle::CPUPlace());
}

// The upstream gradient, checked to be x's dtype and the forward output's shape.
paddle::Tensor grad_output(const paddle::Tensor& g, const std::vector<int64_t>& dims,
                           const Inputs& in, const std::string& op) {
  paddle::Tensor grad = dense_host(g, "the output gradient", op);
  if (grad.shape() != dims || grad.dtype() != in.x.dtype())
    invalid(op, "the output gradient must be " + dtype_text(in.x.dtype()) + " of shape " +
                    dims_text(dims) + ", got " + dtype_text(grad.dtype()) + " of shape " +
                    dims_text(grad.shape()));
  return grad;
}

void check_pooled(int64_t ph, int64_t pw, const std::string& op) {
  if (ph < 1 || pw < 1)
    invalid(op, "output_size must be >= 1, got (" + std::to_string(ph) + ", " +
                    std::to_string(pw) + ")");
}

// Shape inference: never throws (see the file's comment).
int64_t known_or(const std::vector<int64_t>& d, size_t i) { return i < d.size() ? d[i] : -1; }

// ------------------------------------------------------------------------ roi_pool

roicore_max_pool_rules max_rules(const std::vector<int>& rules, const std::string& op) {
  auto r = decode(roicore_max_pool_rules_from_array, rules, op);
  r.argmax_dtype = ROICORE_INT64;  // the Argmax output is int64, as Paddle's
  return r;
}

// Forward into `out` and, if not null, the int64 argmax.
void roi_pool_into(const Inputs& in, const roicore_max_pool_rules& r, float spatial_scale,
                   paddle::Tensor& out, int64_t* argmax, int n_threads, const std::string& op) {
  const roicore_exec ex = exec_of(n_threads);
  const roicore_out_tensor to = out_view(out, in.tx.dtype);
  call(op, [&](roicore_error* err) {
    return roicore_roi_pool_max_forward(&r, &in.tx, &in.rb, spatial_scale, &to, argmax,
                                        ROICORE_INT64, &ex, err);
  });
}

std::vector<paddle::Tensor> RoIPoolForward(const paddle::Tensor& x,
                                           const paddle::Tensor& boxes,
                                           const paddle::Tensor& boxes_num,
                                           const std::vector<int>& rules, int pooled_height,
                                           int pooled_width, float spatial_scale,
                                           bool with_argmax, int n_threads) {
  const std::string op = "roi_pool";
  check_pooled(pooled_height, pooled_width, op);
  const Inputs in = inputs(x, boxes, boxes_num, op);
  const auto r = max_rules(rules, op);
  const std::vector<int64_t> dims{in.rb.k, in.tx.c, pooled_height, pooled_width};
  auto out = output(dims, in.x.dtype(), op);
  auto argmax = output(with_argmax ? dims : std::vector<int64_t>{0}, paddle::DataType::INT64, op);
  roi_pool_into(in, r, spatial_scale, out, with_argmax ? argmax.data<int64_t>() : nullptr,
                n_threads, op);
  return {out, argmax};
}

std::vector<paddle::Tensor> RoIPoolBackward(const paddle::Tensor& x,
                                            const paddle::Tensor& boxes,
                                            const paddle::Tensor& boxes_num,
                                            const paddle::Tensor& argmax_in,
                                            const paddle::Tensor& grad_out_in,
                                            const std::vector<int>& rules, int pooled_height,
                                            int pooled_width, float spatial_scale,
                                            bool with_argmax, int n_threads) {
  const std::string op = "roi_pool_grad";
  check_pooled(pooled_height, pooled_width, op);
  const Inputs in = inputs(x, boxes, boxes_num, op);
  const auto r = max_rules(rules, op);
  const std::vector<int64_t> dims{in.rb.k, in.tx.c, pooled_height, pooled_width};
  const paddle::Tensor grad_out = grad_output(grad_out_in, dims, in, op);
  paddle::Tensor argmax = dense_host(argmax_in, "argmax", op);
  if (argmax.shape() != dims || argmax.dtype() != paddle::DataType::INT64) {
    // recorded without its argmax (no gradient was expected then): recompute it
    argmax = output(dims, paddle::DataType::INT64, op);
    auto scratch = output(dims, in.x.dtype(), op);
    roi_pool_into(in, r, spatial_scale, scratch, argmax.data<int64_t>(), n_threads, op);
  }
  auto dx = output(x.shape(), in.x.dtype(), op);
  const roicore_exec ex = exec_of(n_threads);
  const roicore_tensor tg = view(grad_out, in.tx.dtype);
  const roicore_out_tensor tdx = out_view(dx, in.tx.dtype);
  call(op, [&](roicore_error* err) {
    return roicore_roi_pool_max_backward(&r, &tg, argmax.data(), ROICORE_INT64, &in.rb, &tdx,
                                         &ex, err);
  });
  return {dx};
}

std::vector<std::vector<int64_t>> RoIPoolShape(const std::vector<int64_t>& x,
                                               const std::vector<int64_t>& boxes,
                                               const std::vector<int64_t>& boxes_num,
                                               const std::vector<int>& rules,
                                               int pooled_height, int pooled_width,
                                               float spatial_scale, bool with_argmax,
                                               int n_threads) {
  std::vector<int64_t> out{known_or(boxes, 0), known_or(x, 1), pooled_height, pooled_width};
  return {out, with_argmax ? out : std::vector<int64_t>{0}};
}

std::vector<paddle::DataType> RoIPoolDtype(const paddle::DataType& x, const paddle::DataType&,
                                           const paddle::DataType&) {
  return {x, paddle::DataType::INT64};
}

// ------------------------------------------------------------------------ psroi_pool

// Output channels: the attribute, or C / (PH * PW) when it is -1 (the messages are
// roicore.core's).
int64_t ps_channels(int64_t c, int output_channels, int pooled_height, int pooled_width,
                    const std::string& op) {
  const int64_t area = static_cast<int64_t>(pooled_height) * pooled_width;
  const std::string group = std::to_string(pooled_height) + "x" + std::to_string(pooled_width);
  int64_t d = output_channels;
  if (d < 0) {
    if (c % area != 0)
      invalid(op, "x has C=" + std::to_string(c) + " channels, which is not a multiple of the "
                  "group area " + group + "=" + std::to_string(area));
    d = c / area;
  }
  if (d < 1) invalid(op, "output_channels must be >= 1, got " + std::to_string(d));
  int64_t want = 0;
  const bool overflow = __builtin_mul_overflow(d, area, &want);
  if (overflow || c != want)
    invalid(op, "x must have output_channels * " + std::to_string(pooled_height) + " * " +
                    std::to_string(pooled_width) + " = " +
                    (overflow ? std::string("more than 2**63") : std::to_string(want)) +
                    " channels (output_channels=" + std::to_string(d) + ", group " + group +
                    "), got C=" + std::to_string(c));
  return d;
}

std::vector<paddle::Tensor> PSRoIPoolForward(const paddle::Tensor& x,
                                             const paddle::Tensor& boxes,
                                             const paddle::Tensor& boxes_num,
                                             const std::vector<int>& rules, int pooled_height,
                                             int pooled_width, int output_channels,
                                             float spatial_scale, int n_threads) {
  const std::string op = "psroi_pool";
  check_pooled(pooled_height, pooled_width, op);
  const Inputs in = inputs(x, boxes, boxes_num, op);
  const auto r = decode(roicore_ps_roi_pool_rules_from_array, rules, op);
  const int64_t d = ps_channels(in.tx.c, output_channels, pooled_height, pooled_width, op);
  auto out = output({in.rb.k, d, pooled_height, pooled_width}, in.x.dtype(), op);
  const roicore_exec ex = exec_of(n_threads);
  const roicore_out_tensor to = out_view(out, in.tx.dtype);
  call(op, [&](roicore_error* err) {
    return roicore_ps_roi_pool_forward(&r, &in.tx, &in.rb, spatial_scale, pooled_height,
                                       pooled_width, &to, &ex, err);
  });
  return {out};
}

std::vector<paddle::Tensor> PSRoIPoolBackward(const paddle::Tensor& x,
                                              const paddle::Tensor& boxes,
                                              const paddle::Tensor& boxes_num,
                                              const paddle::Tensor& grad_out_in,
                                              const std::vector<int>& rules,
                                              int pooled_height, int pooled_width,
                                              int output_channels, float spatial_scale,
                                              int n_threads) {
  const std::string op = "psroi_pool_grad";
  check_pooled(pooled_height, pooled_width, op);
  const Inputs in = inputs(x, boxes, boxes_num, op);
  const auto r = decode(roicore_ps_roi_pool_rules_from_array, rules, op);
  const int64_t d = ps_channels(in.tx.c, output_channels, pooled_height, pooled_width, op);
  const paddle::Tensor grad_out =
      grad_output(grad_out_in, {in.rb.k, d, pooled_height, pooled_width}, in, op);
  auto dx = output(x.shape(), in.x.dtype(), op);
  const roicore_exec ex = exec_of(n_threads);
  const roicore_tensor tg = view(grad_out, in.tx.dtype);
  const roicore_out_tensor tdx = out_view(dx, in.tx.dtype);
  call(op, [&](roicore_error* err) {
    return roicore_ps_roi_pool_backward(&r, &tg, &in.rb, spatial_scale, pooled_height,
                                        pooled_width, &tdx, &ex, err);
  });
  return {dx};
}

std::vector<std::vector<int64_t>> PSRoIPoolShape(const std::vector<int64_t>& x,
                                                 const std::vector<int64_t>& boxes,
                                                 const std::vector<int64_t>& boxes_num,
                                                 const std::vector<int>& rules,
                                                 int pooled_height, int pooled_width,
                                                 int output_channels, float spatial_scale,
                                                 int n_threads) {
  const int64_t c = known_or(x, 1), area = static_cast<int64_t>(pooled_height) * pooled_width;
  const int64_t d = output_channels >= 0 ? output_channels : (c >= 0 && area > 0 ? c / area : -1);
  return {{known_or(boxes, 0), d, pooled_height, pooled_width}};
}

std::vector<paddle::DataType> SameAsX(const paddle::DataType& x, const paddle::DataType&,
                                      const paddle::DataType&) {
  return {x};
}

// ------------------------------------------------------------------------ roi_align

std::vector<paddle::Tensor> RoIAlignForward(const paddle::Tensor& x,
                                            const paddle::Tensor& boxes,
                                            const paddle::Tensor& boxes_num,
                                            const std::vector<int>& rules, int pooled_height,
                                            int pooled_width, float spatial_scale,
                                            int sampling_ratio, bool aligned, int n_threads) {
  const std::string op = "roi_align";
  check_pooled(pooled_height, pooled_width, op);
  const Inputs in = inputs(x, boxes, boxes_num, op);
  const auto r = decode(roicore_roi_align_rules_from_array, rules, op);
  auto out = output({in.rb.k, in.tx.c, pooled_height, pooled_width}, in.x.dtype(), op);
  const roicore_exec ex = exec_of(n_threads);
  const roicore_out_tensor to = out_view(out, in.tx.dtype);
  call(op, [&](roicore_error* err) {
    return roicore_roi_align_forward(&r, &in.tx, &in.rb, spatial_scale, sampling_ratio, aligned,
                                     &to, &ex, err);
  });
  return {out};
}

std::vector<paddle::Tensor> RoIAlignBackward(const paddle::Tensor& x,
                                             const paddle::Tensor& boxes,
                                             const paddle::Tensor& boxes_num,
                                             const paddle::Tensor& grad_out_in,
                                             const std::vector<int>& rules, int pooled_height,
                                             int pooled_width, float spatial_scale,
                                             int sampling_ratio, bool aligned, int n_threads) {
  const std::string op = "roi_align_grad";
  check_pooled(pooled_height, pooled_width, op);
  const Inputs in = inputs(x, boxes, boxes_num, op);
  const auto r = decode(roicore_roi_align_rules_from_array, rules, op);
  const std::vector<int64_t> dims{in.rb.k, in.tx.c, pooled_height, pooled_width};
  const paddle::Tensor grad_out = grad_output(grad_out_in, dims, in, op);
  auto dx = output(x.shape(), in.x.dtype(), op);
  const roicore_exec ex = exec_of(n_threads);
  const roicore_tensor tg = view(grad_out, in.tx.dtype);
  const roicore_out_tensor tdx = out_view(dx, in.tx.dtype);
  call(op, [&](roicore_error* err) {
    return roicore_roi_align_backward(&r, &tg, &in.rb, spatial_scale, sampling_ratio, aligned,
                                      &tdx, &ex, err);
  });
  return {dx};
}

std::vector<std::vector<int64_t>> RoIAlignShape(const std::vector<int64_t>& x,
                                                const std::vector<int64_t>& boxes,
                                                const std::vector<int64_t>& boxes_num,
                                                const std::vector<int>& rules,
                                                int pooled_height, int pooled_width,
                                                float spatial_scale, int sampling_ratio,
                                                bool aligned, int n_threads) {
  return {{known_or(boxes, 0), known_or(x, 1), pooled_height, pooled_width}};
}

}  // namespace

// ------------------------------------------------------------------------ registration

PD_BUILD_OP(roicore_roi_pool)
    .Inputs({"X", "Boxes", "BoxesNum"})
    .Outputs({"Out", "Argmax"})
    .Attrs({"rules: std::vector<int>", "pooled_height: int", "pooled_width: int",
            "spatial_scale: float", "with_argmax: bool", "n_threads: int"})
    .SetKernelFn(PD_KERNEL(RoIPoolForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RoIPoolShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RoIPoolDtype));

PD_BUILD_GRAD_OP(roicore_roi_pool)
    .Inputs({"X", "Boxes", "BoxesNum", "Argmax", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"rules: std::vector<int>", "pooled_height: int", "pooled_width: int",
            "spatial_scale: float", "with_argmax: bool", "n_threads: int"})
    .SetKernelFn(PD_KERNEL(RoIPoolBackward));

PD_BUILD_OP(roicore_psroi_pool)
    .Inputs({"X", "Boxes", "BoxesNum"})
    .Outputs({"Out"})
    .Attrs({"rules: std::vector<int>", "pooled_height: int", "pooled_width: int",
            "output_channels: int", "spatial_scale: float", "n_threads: int"})
    .SetKernelFn(PD_KERNEL(PSRoIPoolForward))
    .SetInferShapeFn(PD_INFER_SHAPE(PSRoIPoolShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameAsX));

PD_BUILD_GRAD_OP(roicore_psroi_pool)
    .Inputs({"X", "Boxes", "BoxesNum", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"rules: std::vector<int>", "pooled_height: int", "pooled_width: int",
            "output_channels: int", "spatial_scale: float", "n_threads: int"})
    .SetKernelFn(PD_KERNEL(PSRoIPoolBackward));

PD_BUILD_OP(roicore_roi_align)
    .Inputs({"X", "Boxes", "BoxesNum"})
    .Outputs({"Out"})
    .Attrs({"rules: std::vector<int>", "pooled_height: int", "pooled_width: int",
            "spatial_scale: float", "sampling_ratio: int", "aligned: bool", "n_threads: int"})
    .SetKernelFn(PD_KERNEL(RoIAlignForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RoIAlignShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameAsX));

PD_BUILD_GRAD_OP(roicore_roi_align)
    .Inputs({"X", "Boxes", "BoxesNum", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"rules: std::vector<int>", "pooled_height: int", "pooled_width: int",
            "spatial_scale: float", "sampling_ratio: int", "aligned: bool", "n_threads: int"})
    .SetKernelFn(PD_KERNEL(RoIAlignBackward));
