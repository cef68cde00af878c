// A C++ program that serves a SavedModel holding roicore's ops through TensorFlow's C API
// alone: the op library loaded with TF_LoadLibrary, the model with
// TF_LoadSessionFromSavedModel (tests/adapters/test_tf_native.py builds and runs it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/c/c_api.h"

static void check(TF_Status* s, const char* what) {
  if (TF_GetCode(s) != TF_OK) {
    std::fprintf(stderr, "%s: %s\n", what, TF_Message(s));
    std::exit(1);
  }
}

static TF_Output output(TF_Graph* g, const std::string& name) {
  const size_t colon = name.rfind(':');
  TF_Operation* op = TF_GraphOperationByName(g, name.substr(0, colon).c_str());
  if (op == nullptr) {
    std::fprintf(stderr, "no operation %s\n", name.c_str());
    std::exit(1);
  }
  return TF_Output{op, std::atoi(name.c_str() + colon + 1)};
}

// serve LIBRARY SAVED_MODEL INPUT_NAME OUTPUT_NAME INPUT_FILE OUTPUT_FILE N H W C
int main(int argc, char** argv) {
  if (argc != 11) return 2;
  TF_Status* s = TF_NewStatus();
  TF_LoadLibrary(argv[1], s);  // registers roicore's ops and kernels
  check(s, "TF_LoadLibrary");
  TF_Graph* graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  const char* tags[] = {"serve"};
  TF_Session* session =
      TF_LoadSessionFromSavedModel(options, nullptr, argv[2], tags, 1, graph, nullptr, s);
  check(s, "TF_LoadSessionFromSavedModel");
  const int64_t dims[4] = {std::atoll(argv[7]), std::atoll(argv[8]), std::atoll(argv[9]),
                           std::atoll(argv[10])};
  const size_t bytes = sizeof(float) * dims[0] * dims[1] * dims[2] * dims[3];
  TF_Tensor* input = TF_AllocateTensor(TF_FLOAT, dims, 4, bytes);
  FILE* f = std::fopen(argv[5], "rb");
  if (f == nullptr || std::fread(TF_TensorData(input), 1, bytes, f) != bytes) return 3;
  std::fclose(f);
  const TF_Output in = output(graph, argv[3]), out = output(graph, argv[4]);
  TF_Tensor* result = nullptr;
  TF_SessionRun(session, nullptr, &in, &input, 1, &out, &result, 1, nullptr, 0, nullptr, s);
  check(s, "TF_SessionRun");
  f = std::fopen(argv[6], "wb");
  std::fwrite(TF_TensorData(result), 1, TF_TensorByteSize(result), f);
  std::fclose(f);
  std::printf("served %zu bytes\n", TF_TensorByteSize(result));
  return 0;
}
