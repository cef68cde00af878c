/* roicore's RoI operators as TensorFlow ops: registrations, shape functions and CPU
 * kernels on roicore's C library (roicore.h).  roicore.adapters.tf builds the ops, wraps
 * them in their gradients and is the documented way to call them.
 *
 * Every op takes
 *   images       in the layout of its data_format attribute, float or double;
 *   boxes        TF's (K, 4) rows [y1, x1, y2, x2], float or double;
 *   box_indices  the image of each box, int32 or int64;
 *   rules        the fields of a roicore.core.conventions record as an integer list,
 *                decoded by roicore_*_rules_from_array, so the conventions are defined
 *                once, in Python, and travel with a saved graph;
 *   n_threads    OpenMP threads (0: roicore's default).
 * Gradient ops take the forward's image shape as a 4-element `image_size` (in the
 * layout of data_format), as TF's CropAndResizeGradImage does.
 *
 * The C library checks every argument it sees (batch indices, coordinates, rules); its
 * message becomes the op's error, InvalidArgument for bad input.  The kernels check
 * what only the framework sees: ranks and the agreement of tensor shapes.
 */
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "roicore.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

// The one symbol this library exports besides the framework's registrations: it points
// the library's copy of roicore's C library at the runtime of roicore.core's (memory
// limit, kept scratch, Ctrl-C; see roicore.h), which roicore.adapters does right after
// loading it.  0 when shared, else the C API's status.
extern "C" __attribute__((visibility("default"))) int roicore_native_share_runtime(
    void* runtime) {
  return roicore_runtime_share(static_cast<roicore_runtime*>(runtime), nullptr);
}

namespace roicore_tf {
namespace {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;
using Status = absl::Status;

// ------------------------------------------------------------------------------------
// The C library's results as TF statuses

// An InvalidArgument status whose message is the arguments, concatenated.
template <typename... Args>
Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

Status ToStatus(int code, const roicore_error& err) {
  if (code == ROICORE_OK) return absl::OkStatus();
  const std::string message(err.message);
  switch (code) {
    case ROICORE_ERR_MEMORY:
      return absl::ResourceExhaustedError(message);
    case ROICORE_ERR_INTERRUPTED:
      return absl::CancelledError(message);
    case ROICORE_ERR_UNSUPPORTED:
      return absl::UnimplementedError(message);
    default:  // ROICORE_ERR_ARGUMENT, ROICORE_ERR_VALUE: the caller's input
      return absl::InvalidArgumentError(message);
  }
}

// The status of `call(roicore_error*)`, a C library call given its error record.
template <typename Call>
Status Check(Call call) {
  roicore_error err;
  const int code = call(&err);
  return ToStatus(code, err);
}

// An op's rules attribute decoded (and range-checked) by the C library.
template <typename Rules, typename Decode>
Status DecodeRules(const std::vector<int64_t>& fields, Decode decode, Rules* rules) {
  return Check([&](roicore_error* err) {
    return decode(fields.data(), static_cast<int64_t>(fields.size()), rules, err);
  });
}

// Stops a long call when TF cancels the step (the C library polls between pieces).
int StepCancelled(void* manager) {
  return static_cast<tensorflow::CancellationManager*>(manager)->IsCancelled() ? 1 : 0;
}

roicore_dtype DtypeOf(DataType type) {
  return type == tensorflow::DT_DOUBLE ? ROICORE_FLOAT64 : ROICORE_FLOAT32;
}

roicore_index_type IndexTypeOf(DataType type) {
  return type == tensorflow::DT_INT64 ? ROICORE_INT64 : ROICORE_INT32;
}

// ------------------------------------------------------------------------------------
// What every kernel shares: layout, threads, rules, boxes

class RoiKernel : public OpKernel {
 protected:
  explicit RoiKernel(OpKernelConstruction* c) : OpKernel(c) {
    std::string format;
    OP_REQUIRES_OK(c, c->GetAttr("data_format", &format));
    nhwc_ = format == "NHWC";
    OP_REQUIRES_OK(c, c->GetAttr("n_threads", &n_threads_));
    OP_REQUIRES_OK(c, c->GetAttr("rules", &rules_));
  }

  roicore_exec Exec(OpKernelContext* ctx) const {
    roicore_exec exec{};
    exec.n_threads = n_threads_;
    if (ctx->cancellation_manager() != nullptr) {
      exec.poll = StepCancelled;
      exec.poll_arg = ctx->cancellation_manager();
    }
    return exec;
  }

  // A 4-D tensor in this op's layout (roicore_tensor: read, roicore_out_tensor: written);
  // `shape` names its dimensions for messages.
  template <typename Described>
  Status Describe(const Tensor& t, const char* name, const char* shape, Described* out) const {
    if (t.dims() != 4) {
      return Invalid(name, " must be a 4-D ", shape, " tensor (",
                     nhwc_ ? "NHWC" : "NCHW", "), got shape ",
                     t.shape().DebugString());
    }
    *out = Described{};
    out->data = t.data();
    out->dtype = DtypeOf(t.dtype());
    out->layout = nhwc_ ? ROICORE_NHWC : ROICORE_NCHW;
    out->n = t.dim_size(0);
    out->c = t.dim_size(nhwc_ ? 3 : 1);
    out->h = t.dim_size(nhwc_ ? 1 : 2);
    out->w = t.dim_size(nhwc_ ? 2 : 3);
    return absl::OkStatus();
  }

  // `what`'s shape (n, c, h, w) in this op's layout.  TensorShape's constructor aborts the
  // process when the sizes overflow, so the shape is built with a status: too many
  // elements are InvalidArgument, as roicore.core refuses them.
  Status Shape4(const char* what, int64_t n, int64_t c, int64_t h, int64_t w,
                TensorShape* shape) const {
    const Status built = nhwc_ ? TensorShape::BuildTensorShape({n, h, w, c}, shape)
                               : TensorShape::BuildTensorShape({n, c, h, w}, shape);
    if (!built.ok()) {
      return Invalid(what, " of shape (K, C, H, W) = (", n, ", ", c, ", ", h, ", ", w,
                     ") has more elements than a tensor can hold: ", built.message());
    }
    return absl::OkStatus();
  }

  // The forward's image shape from a gradient op's `image_size` input (in this op's
  // layout).
  Status ImageSize(const Tensor& size, TensorShape* shape) const {
    if (size.dims() != 1 || size.NumElements() != 4) {
      return Invalid("image_size must have 4 elements, got shape ",
                     size.shape().DebugString());
    }
    auto v = size.vec<int32_t>();
    for (int i = 0; i < 4; ++i) {
      if (v(i) < 0) return Invalid("image_size must be non-negative, got ", v(i));
    }
    const Status built = TensorShape::BuildTensorShape({v(0), v(1), v(2), v(3)}, shape);
    if (!built.ok()) {
      return Invalid("image_size [", v(0), ", ", v(1), ", ", v(2), ", ", v(3),
                     "] has more elements than a tensor can hold: ", built.message());
    }
    return absl::OkStatus();
  }

  // The checked image of each of the k boxes (TF's box_indices).
  Status ReadBatch(OpKernelContext* ctx, const Tensor& indices, int64_t k, int64_t n_images,
                   Tensor* batch) const {
    if (indices.dims() != 1 || indices.dim_size(0) != k) {
      return Invalid("box_indices must have shape (", k,
                     ",), one image index per box, got ",
                     indices.shape().DebugString());
    }
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({k}), batch));
    return Check([&](roicore_error* err) {
      return roicore_batch_from_indices(indices.data(), IndexTypeOf(indices.dtype()), k,
                                        n_images, /*masked=*/0, "box_indices",
                                        batch->flat<int64_t>().data(), err);
    });
  }

  // Boxes as the C library takes them: [x1, y1, x2, y2] rows in the images' dtype.
  struct Boxes {
    Tensor coords, batch;
    roicore_boxes view;
  };

  Status ReadBoxes(OpKernelContext* ctx, const Tensor& boxes, const Tensor& indices,
                   roicore_dtype dtype, int64_t n_images, Boxes* out) const {
    if (boxes.dims() != 2 || boxes.dim_size(1) != 4) {
      return Invalid("boxes must have shape (K, 4) [y1, x1, y2, x2], got ",
                     boxes.shape().DebugString());
    }
    const int64_t k = boxes.dim_size(0);
    TF_RETURN_IF_ERROR(ReadBatch(ctx, indices, k, n_images, &out->batch));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        dtype == ROICORE_FLOAT64 ? tensorflow::DT_DOUBLE : tensorflow::DT_FLOAT,
        TensorShape({k, 4}), &out->coords));
    TF_RETURN_IF_ERROR(Check([&](roicore_error* err) {
      return roicore_convert_coords(boxes.data(), DtypeOf(boxes.dtype()), 4, 0, /*yx=*/1, k,
                                    out->coords.data(), dtype, err);
    }));
    out->view = roicore_boxes{};
    out->view.coords = out->coords.data();
    out->view.batch = out->batch.flat<int64_t>().data();
    out->view.k = k;
    return absl::OkStatus();
  }

  // A forward op's images (input 0) and boxes (inputs 1 and 2).
  Status ReadForward(OpKernelContext* ctx, roicore_tensor* x, Boxes* boxes) const {
    TF_RETURN_IF_ERROR(Describe(ctx->input(0), "images", "(N, H, W, C)", x));
    return ReadBoxes(ctx, ctx->input(1), ctx->input(2), x->dtype, x->n, boxes);
  }

  // A gradient op's upstream gradient (input 0) and the forward's image shape (input 3).
  Status ReadGradient(OpKernelContext* ctx, roicore_tensor* g, TensorShape* image_shape) const {
    TF_RETURN_IF_ERROR(Describe(ctx->input(0), "grads", "(K, PH, PW, C)", g));
    return ImageSize(ctx->input(3), image_shape);
  }

  // Output `index`, of `shape` in this op's layout, described for the C library; refused
  // beforehand (ResourceExhausted) when it would pass roicore's memory limit.
  Status Allocate(OpKernelContext* ctx, int index, const TensorShape& shape,
                  roicore_out_tensor* out) const {
    const int64_t bytes = roicore_mul(shape.num_elements(), static_cast<int64_t>(
        tensorflow::DataTypeSize(ctx->expected_output_dtype(index))));
    const std::string what = absl::StrCat("the output of shape ", shape.DebugString());
    TF_RETURN_IF_ERROR(Check([&](roicore_error* err) {
      return roicore_check_allocation(bytes, what.c_str(), err);
    }));
    Tensor* t = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &t));
    return Describe(*t, "output", "", out);
  }

  // A forward op: its images and boxes read, its (K, C / group, ph, pw) output allocated,
  // then the C library's `call(x, boxes, out, exec, err)`.
  template <typename Call>
  void Forward(OpKernelContext* ctx, int64_t ph, int64_t pw, int64_t group, Call call) const {
    roicore_tensor x;
    roicore_out_tensor out;
    Boxes boxes;
    OP_REQUIRES_OK(ctx, ReadForward(ctx, &x, &boxes));
    OP_REQUIRES(ctx, x.c % group == 0,
                Invalid("images has C=", x.c, " channels, which is not a multiple of the "
                        "group area ", group));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, Shape4("the output", boxes.view.k, x.c / group, ph, pw, &shape));
    OP_REQUIRES_OK(ctx, Allocate(ctx, 0, shape, &out));
    const roicore_exec exec = Exec(ctx);
    OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
      return call(&x, &boxes.view, &out, &exec, err);
    }));
  }

  bool nhwc_ = true;
  int n_threads_ = 0;
  std::vector<int64_t> rules_;
};

// ------------------------------------------------------------------------------------
// RoI max pooling

class RoiPoolMaxOp : public RoiKernel {
 public:
  explicit RoiPoolMaxOp(OpKernelConstruction* c) : RoiKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("pooled_height", &ph_));
    OP_REQUIRES_OK(c, c->GetAttr("pooled_width", &pw_));
    OP_REQUIRES_OK(c, c->GetAttr("spatial_scale", &spatial_scale_));
    OP_REQUIRES_OK(c, c->GetAttr("compute_argmax", &compute_argmax_));
    OP_REQUIRES_OK(c, DecodeRules(rules_, roicore_max_pool_rules_from_array, &rules_c_));
  }

  void Compute(OpKernelContext* ctx) override {
    roicore_tensor x;
    roicore_out_tensor out;
    Boxes boxes;
    OP_REQUIRES_OK(ctx, ReadForward(ctx, &x, &boxes));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, Shape4("the output", boxes.view.k, x.c, ph_, pw_, &shape));
    OP_REQUIRES_OK(ctx, Allocate(ctx, 0, shape, &out));
    // The argmax only when a gradient may need it: asked for, and used downstream (a
    // graph that never differentiates leaves it unused, and it is not computed).
    Tensor* argmax = nullptr;
    if (!compute_argmax_) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({0}), &argmax));
      argmax = nullptr;
    } else if (ctx->output_required(1)) {
      roicore_index_type type = ROICORE_INT64;
      OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
        return roicore_max_pool_argmax_type(&rules_c_, &x, &type, err);
      }));
      OP_REQUIRES(ctx, rules_c_.argmax_dtype != ROICORE_INT64,
                  Invalid("rules asks for an int64 argmax (argmax_dtype), but this op's "
                          "argmax output is int32: give rules with an int32 argmax"));
      OP_REQUIRES(ctx, type == ROICORE_INT32,
                  Invalid("feature maps of ", x.h, "x", x.w,
                          " >= 2**31 pixels per plane are not supported"));
      OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
        return roicore_check_allocation(roicore_mul(shape.num_elements(), 4), "the argmax",
                                        err);
      }));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, shape, &argmax));
    }
    const roicore_exec exec = Exec(ctx);
    OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
      return roicore_roi_pool_max_forward(&rules_c_, &x, &boxes.view, spatial_scale_, &out,
                                          argmax ? argmax->data() : nullptr, ROICORE_INT32,
                                          &exec, err);
    }));
  }

 private:
  int ph_ = 1, pw_ = 1;
  float spatial_scale_ = 1;
  bool compute_argmax_ = true;
  roicore_max_pool_rules rules_c_;
};

class RoiPoolMaxGradOp : public RoiKernel {
 public:
  explicit RoiPoolMaxGradOp(OpKernelConstruction* c) : RoiKernel(c) {
    OP_REQUIRES_OK(c, DecodeRules(rules_, roicore_max_pool_rules_from_array, &rules_c_));
  }

  void Compute(OpKernelContext* ctx) override {
    roicore_tensor g;
    roicore_out_tensor d;
    TensorShape image_shape;
    OP_REQUIRES_OK(ctx, ReadGradient(ctx, &g, &image_shape));
    const Tensor& argmax = ctx->input(1);
    OP_REQUIRES(ctx, argmax.shape() == ctx->input(0).shape(),
                Invalid("argmax must have the shape of grads, ",
                        ctx->input(0).shape().DebugString(), ", got ",
                        argmax.shape().DebugString()));
    Tensor batch;
    OP_REQUIRES_OK(ctx, ReadBatch(ctx, ctx->input(2), g.n, image_shape.dim_size(0), &batch));
    OP_REQUIRES_OK(ctx, Allocate(ctx, 0, image_shape, &d));
    roicore_boxes boxes{};
    boxes.batch = batch.flat<int64_t>().data();
    boxes.k = g.n;
    const roicore_exec exec = Exec(ctx);
    OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
      return roicore_roi_pool_max_backward(&rules_c_, &g, argmax.data(), ROICORE_INT32, &boxes,
                                           &d, &exec, err);
    }));
  }

 private:
  roicore_max_pool_rules rules_c_;
};

// The image gradient ops of the other operators: (grads, boxes, box_indices, image_size).
class ImageGradKernel : public RoiKernel {
 protected:
  using RoiKernel::RoiKernel;

  // The upstream gradient and the boxes read, the image gradient allocated, then the C
  // library's `call(g, boxes, d, exec, err)`.
  template <typename Call>
  void Backward(OpKernelContext* ctx, Call call) const {
    roicore_tensor g;
    roicore_out_tensor d;
    TensorShape image_shape;
    Boxes boxes;
    OP_REQUIRES_OK(ctx, ReadGradient(ctx, &g, &image_shape));
    OP_REQUIRES_OK(ctx, ReadBoxes(ctx, ctx->input(1), ctx->input(2), g.dtype,
                                  image_shape.dim_size(0), &boxes));
    OP_REQUIRES_OK(ctx, Allocate(ctx, 0, image_shape, &d));
    const roicore_exec exec = Exec(ctx);
    OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
      return call(&g, &boxes.view, &d, &exec, err);
    }));
  }
};

// ------------------------------------------------------------------------------------
// crop_and_resize: bilinear and nearest RoI pooling

// The crop ops' attributes: the method and the rules.
template <typename Base>
class CropKernel : public Base {
 protected:
  explicit CropKernel(OpKernelConstruction* c) : Base(c) {
    std::string method;
    OP_REQUIRES_OK(c, c->GetAttr("method", &method));
    nearest_ = method == "nearest";
    OP_REQUIRES_OK(c, DecodeRules(this->rules_, roicore_bilinear_pool_rules_from_array,
                                  &rules_c_));
  }

  bool nearest_ = false;
  roicore_bilinear_pool_rules rules_c_;
};

class CropAndResizeOp : public CropKernel<RoiKernel> {
 public:
  explicit CropAndResizeOp(OpKernelConstruction* c) : CropKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("crop_height", &ph_));
    OP_REQUIRES_OK(c, c->GetAttr("crop_width", &pw_));
    OP_REQUIRES_OK(c, c->GetAttr("extrapolation_value", &extrapolation_value_));
  }

  void Compute(OpKernelContext* ctx) override {
    const auto forward = nearest_ ? roicore_roi_pool_nearest_forward
                                  : roicore_roi_pool_bilinear_forward;
    Forward(ctx, ph_, pw_, 1, [&](auto x, auto boxes, auto out, auto exec, auto err) {
      return forward(&rules_c_, x, boxes, extrapolation_value_, out, exec, err);
    });
  }

 private:
  int ph_ = 1, pw_ = 1;
  float extrapolation_value_ = 0;
};

class CropAndResizeGradImageOp : public CropKernel<ImageGradKernel> {
 public:
  explicit CropAndResizeGradImageOp(OpKernelConstruction* c) : CropKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const auto backward = nearest_ ? roicore_roi_pool_nearest_backward
                                   : roicore_roi_pool_bilinear_backward;
    Backward(ctx, [&](auto g, auto boxes, auto d, auto exec, auto err) {
      return backward(&rules_c_, g, boxes, d, exec, err);
    });
  }
};

class CropAndResizeGradBoxesOp : public CropKernel<RoiKernel> {
 public:
  explicit CropAndResizeGradBoxesOp(OpKernelConstruction* c) : CropKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    roicore_tensor g, x;
    OP_REQUIRES_OK(ctx, Describe(ctx->input(0), "grads", "(K, PH, PW, C)", &g));
    OP_REQUIRES_OK(ctx, Describe(ctx->input(1), "images", "(N, H, W, C)", &x));
    const Tensor& boxes_in = ctx->input(2);
    Boxes boxes;
    OP_REQUIRES_OK(ctx, ReadBoxes(ctx, boxes_in, ctx->input(3), x.dtype, x.n, &boxes));
    // the gradient of the [x1, y1, x2, y2] rows, in the images' dtype
    Tensor grad_xyxy;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(ctx->input(1).dtype(),
                                           TensorShape({boxes.view.k, 4}), &grad_xyxy));
    const roicore_exec exec = Exec(ctx);
    OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
      return roicore_roi_pool_bilinear_boxes_backward(&rules_c_, &g, &x, &boxes.view,
                                                      grad_xyxy.data(), &exec, err);
    }));
    Tensor* grad_boxes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, boxes_in.shape(), &grad_boxes));
    // back to TF's [y1, x1, y2, x2] columns and the boxes' dtype: swapping the columns of
    // each pair is its own inverse, so the conversion that reads TF's rows writes them
    OP_REQUIRES_OK(ctx, Check([&](roicore_error* err) {
      return roicore_convert_coords(grad_xyxy.data(), x.dtype, 4, 0, /*yx=*/1, boxes.view.k,
                                    grad_boxes->data(), DtypeOf(boxes_in.dtype()), err);
    }));
  }
};

// ------------------------------------------------------------------------------------
// Position-sensitive RoI average pooling

template <typename Base>
class PsroiPoolKernel : public Base {
 protected:
  explicit PsroiPoolKernel(OpKernelConstruction* c) : Base(c) {
    OP_REQUIRES_OK(c, c->GetAttr("group_height", &gh_));
    OP_REQUIRES_OK(c, c->GetAttr("group_width", &gw_));
    OP_REQUIRES_OK(c, c->GetAttr("spatial_scale", &spatial_scale_));
    OP_REQUIRES_OK(c, DecodeRules(this->rules_, roicore_ps_roi_pool_rules_from_array,
                                  &rules_c_));
  }

  int gh_ = 1, gw_ = 1;
  float spatial_scale_ = 1;
  roicore_ps_roi_pool_rules rules_c_;
};

class PsroiPoolOp : public PsroiPoolKernel<RoiKernel> {
 public:
  explicit PsroiPoolOp(OpKernelConstruction* c) : PsroiPoolKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("pooled_height", &ph_));
    OP_REQUIRES_OK(c, c->GetAttr("pooled_width", &pw_));
  }

  void Compute(OpKernelContext* ctx) override {
    Forward(ctx, ph_, pw_, static_cast<int64_t>(gh_) * gw_,
            [&](auto x, auto boxes, auto out, auto exec, auto err) {
              return roicore_ps_roi_pool_forward(&rules_c_, x, boxes, spatial_scale_, gh_, gw_,
                                                 out, exec, err);
            });
  }

 private:
  int ph_ = 1, pw_ = 1;
};

class PsroiPoolGradOp : public PsroiPoolKernel<ImageGradKernel> {
 public:
  explicit PsroiPoolGradOp(OpKernelConstruction* c) : PsroiPoolKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    Backward(ctx, [&](auto g, auto boxes, auto d, auto exec, auto err) {
      return roicore_ps_roi_pool_backward(&rules_c_, g, boxes, spatial_scale_, gh_, gw_, d,
                                          exec, err);
    });
  }
};

// ------------------------------------------------------------------------------------
// RoIAlign

template <typename Base>
class RoiAlignKernel : public Base {
 protected:
  explicit RoiAlignKernel(OpKernelConstruction* c) : Base(c) {
    OP_REQUIRES_OK(c, c->GetAttr("spatial_scale", &spatial_scale_));
    OP_REQUIRES_OK(c, c->GetAttr("sampling_ratio", &sampling_ratio_));
    OP_REQUIRES_OK(c, c->GetAttr("aligned", &aligned_));
    OP_REQUIRES_OK(c, DecodeRules(this->rules_, roicore_roi_align_rules_from_array,
                                  &rules_c_));
  }

  float spatial_scale_ = 1;
  int sampling_ratio_ = -1;
  bool aligned_ = false;
  roicore_roi_align_rules rules_c_;
};

class RoiAlignOp : public RoiAlignKernel<RoiKernel> {
 public:
  explicit RoiAlignOp(OpKernelConstruction* c) : RoiAlignKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("pooled_height", &ph_));
    OP_REQUIRES_OK(c, c->GetAttr("pooled_width", &pw_));
  }

  void Compute(OpKernelContext* ctx) override {
    Forward(ctx, ph_, pw_, 1, [&](auto x, auto boxes, auto out, auto exec, auto err) {
      return roicore_roi_align_forward(&rules_c_, x, boxes, spatial_scale_, sampling_ratio_,
                                       aligned_, out, exec, err);
    });
  }

 private:
  int ph_ = 1, pw_ = 1;
};

class RoiAlignGradOp : public RoiAlignKernel<ImageGradKernel> {
 public:
  explicit RoiAlignGradOp(OpKernelConstruction* c) : RoiAlignKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    Backward(ctx, [&](auto g, auto boxes, auto d, auto exec, auto err) {
      return roicore_roi_align_backward(&rules_c_, g, boxes, spatial_scale_, sampling_ratio_,
                                        aligned_, d, exec, err);
    });
  }
};

// ------------------------------------------------------------------------------------
// Shape functions: static shapes wherever the inputs have them

// (k, c, h, w) in the op's layout.
ShapeHandle Shape4(InferenceContext* c, DimensionHandle k, DimensionHandle ch,
                   DimensionHandle h, DimensionHandle w) {
  std::string format;
  if (!c->GetAttr("data_format", &format).ok()) format = "NHWC";
  return format == "NHWC" ? c->MakeShape({k, h, w, ch}) : c->MakeShape({k, ch, h, w});
}

// The channels of the images (input 0), after checking their rank: Dim() past a known
// rank reads out of bounds (it is only DCHECKed).
Status Channels(InferenceContext* c, DimensionHandle* channels) {
  ShapeHandle images;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &images));
  std::string format;
  if (!c->GetAttr("data_format", &format).ok()) format = "NHWC";
  *channels = c->Dim(images, format == "NHWC" ? 3 : 1);
  return absl::OkStatus();
}

// images (rank 4), boxes (K, 4) and box_indices (K,): K.
Status BoxCount(InferenceContext* c, int images, int boxes, int indices, DimensionHandle* k) {
  ShapeHandle s;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(images), 4, &s));
  ShapeHandle b, i;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(boxes), 2, &b));
  DimensionHandle four;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(b, 1), 4, &four));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(indices), 1, &i));
  return c->Merge(c->Dim(b, 0), c->Dim(i, 0), k);
}

// A forward op's output: (K, channels, height attr, width attr).
Status PooledShape(InferenceContext* c, const char* height, const char* width,
                   DimensionHandle channels) {
  DimensionHandle k;
  TF_RETURN_IF_ERROR(BoxCount(c, 0, 1, 2, &k));
  int ph, pw;
  TF_RETURN_IF_ERROR(c->GetAttr(height, &ph));
  TF_RETURN_IF_ERROR(c->GetAttr(width, &pw));
  c->set_output(0, Shape4(c, k, channels, c->MakeDim(ph), c->MakeDim(pw)));
  return absl::OkStatus();
}

Status SameChannelsShape(InferenceContext* c, const char* height, const char* width) {
  DimensionHandle channels;
  TF_RETURN_IF_ERROR(Channels(c, &channels));
  return PooledShape(c, height, width, channels);
}

// A gradient op's output: the image shape its `image_size` input holds.
Status ImageSizeShape(InferenceContext* c, int image_size) {
  ShapeHandle shape;
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(image_size, &shape));
  TF_RETURN_IF_ERROR(c->WithRank(shape, 4, &shape));
  c->set_output(0, shape);
  return absl::OkStatus();
}

}  // namespace

// ------------------------------------------------------------------------------------
// Registrations

#define ROICORE_COMMON_ATTRS                          \
  Attr("T: {float, double}")                          \
      .Attr("Tboxes: {float, double}")                \
      .Attr("Tindices: {int32, int64}")               \
      .Attr("rules: list(int)")                       \
      .Attr("data_format: {'NHWC', 'NCHW'} = 'NHWC'") \
      .Attr("n_threads: int = 0")

REGISTER_OP("RoicoreRoiPoolMax")
    .Input("images: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Output("output: T")
    .Output("argmax: int32")
    .Attr("pooled_height: int >= 1")
    .Attr("pooled_width: int >= 1")
    .Attr("spatial_scale: float")
    .Attr("compute_argmax: bool = true")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(SameChannelsShape(c, "pooled_height", "pooled_width"));
      bool argmax;
      TF_RETURN_IF_ERROR(c->GetAttr("compute_argmax", &argmax));
      c->set_output(1, argmax ? c->output(0) : c->MakeShape({0}));
      return absl::OkStatus();
    })
    .Doc("RoI max pooling (Fast R-CNN); argmax (h*W + w per plane) feeds the gradient.");

REGISTER_OP("RoicoreRoiPoolMaxGrad")
    .Input("grads: T")
    .Input("argmax: int32")
    .Input("box_indices: Tindices")
    .Input("image_size: int32")
    .Output("output: T")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("rules: list(int)")
    .Attr("data_format: {'NHWC', 'NCHW'} = 'NHWC'")
    .Attr("n_threads: int = 0")
    .SetShapeFn([](InferenceContext* c) { return ImageSizeShape(c, 3); })
    .Doc("Gradient of RoicoreRoiPoolMax with respect to the images.");

REGISTER_OP("RoicoreCropAndResize")
    .Input("images: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Output("output: T")
    .Attr("crop_height: int >= 1")
    .Attr("crop_width: int >= 1")
    .Attr("method: {'bilinear', 'nearest'} = 'bilinear'")
    .Attr("extrapolation_value: float = 0")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) {
      return SameChannelsShape(c, "crop_height", "crop_width");
    })
    .Doc("tf.image.crop_and_resize's sampling (bilinear or nearest), in the images' dtype.");

REGISTER_OP("RoicoreCropAndResizeGradImage")
    .Input("grads: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Input("image_size: int32")
    .Output("output: T")
    .Attr("method: {'bilinear', 'nearest'} = 'bilinear'")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) { return ImageSizeShape(c, 3); })
    .Doc("Gradient of RoicoreCropAndResize with respect to the images.");

REGISTER_OP("RoicoreCropAndResizeGradBoxes")
    .Input("grads: T")
    .Input("images: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Output("output: Tboxes")
    .Attr("method: {'bilinear', 'nearest'} = 'bilinear'")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle k;
      TF_RETURN_IF_ERROR(BoxCount(c, 1, 2, 3, &k));
      c->set_output(0, c->Matrix(k, 4));
      return absl::OkStatus();
    })
    .Doc("Gradient of RoicoreCropAndResize with respect to the boxes (of the bilinear crop, "
         "for either method, as TF's CropAndResizeGradBoxes).");

REGISTER_OP("RoicorePsroiPool")
    .Input("images: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Output("output: T")
    .Attr("pooled_height: int >= 1")
    .Attr("pooled_width: int >= 1")
    .Attr("group_height: int >= 1")
    .Attr("group_width: int >= 1")
    .Attr("spatial_scale: float")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) {
      int gh, gw;
      TF_RETURN_IF_ERROR(c->GetAttr("group_height", &gh));
      TF_RETURN_IF_ERROR(c->GetAttr("group_width", &gw));
      DimensionHandle channels, d;
      TF_RETURN_IF_ERROR(Channels(c, &channels));
      TF_RETURN_IF_ERROR(c->Divide(channels, static_cast<int64_t>(gh) * gw,
                                   /*evenly_divisible=*/true, &d));
      return PooledShape(c, "pooled_height", "pooled_width", d);
    })
    .Doc("Position-sensitive RoI average pooling (R-FCN).");

REGISTER_OP("RoicorePsroiPoolGrad")
    .Input("grads: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Input("image_size: int32")
    .Output("output: T")
    .Attr("group_height: int >= 1")
    .Attr("group_width: int >= 1")
    .Attr("spatial_scale: float")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) { return ImageSizeShape(c, 3); })
    .Doc("Gradient of RoicorePsroiPool with respect to the images.");

REGISTER_OP("RoicoreRoiAlign")
    .Input("images: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Output("output: T")
    .Attr("pooled_height: int >= 1")
    .Attr("pooled_width: int >= 1")
    .Attr("spatial_scale: float")
    .Attr("sampling_ratio: int = -1")
    .Attr("aligned: bool = false")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) {
      return SameChannelsShape(c, "pooled_height", "pooled_width");
    })
    .Doc("RoIAlign (Mask R-CNN).");

REGISTER_OP("RoicoreRoiAlignGrad")
    .Input("grads: T")
    .Input("boxes: Tboxes")
    .Input("box_indices: Tindices")
    .Input("image_size: int32")
    .Output("output: T")
    .Attr("spatial_scale: float")
    .Attr("sampling_ratio: int = -1")
    .Attr("aligned: bool = false")
    .ROICORE_COMMON_ATTRS
    .SetShapeFn([](InferenceContext* c) { return ImageSizeShape(c, 3); })
    .Doc("Gradient of RoicoreRoiAlign with respect to the images.");

#define ROICORE_KERNEL(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), kernel)

ROICORE_KERNEL("RoicoreRoiPoolMax", RoiPoolMaxOp);
ROICORE_KERNEL("RoicoreRoiPoolMaxGrad", RoiPoolMaxGradOp);
ROICORE_KERNEL("RoicoreCropAndResize", CropAndResizeOp);
ROICORE_KERNEL("RoicoreCropAndResizeGradImage", CropAndResizeGradImageOp);
ROICORE_KERNEL("RoicoreCropAndResizeGradBoxes", CropAndResizeGradBoxesOp);
ROICORE_KERNEL("RoicorePsroiPool", PsroiPoolOp);
ROICORE_KERNEL("RoicorePsroiPoolGrad", PsroiPoolGradOp);
ROICORE_KERNEL("RoicoreRoiAlign", RoiAlignOp);
ROICORE_KERNEL("RoicoreRoiAlignGrad", RoiAlignGradOp);

}  // namespace roicore_tf
