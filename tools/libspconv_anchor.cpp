// The anchor of docs/performance/cuda_gpu.md: NVIDIA's closed sparse-convolution engine, libspconv 1.1.10
// (Lidar_AI_Solution's 3DSparseConvolution), on CenterPoint's backbone as NVIDIA's exptool wrote it, timed
// on the GPU that times ours. Written against libspconv's public headers alone.
//
// tools/gpu_check.py --libspconv DIR builds it with nvcc (linked to DIR/lib/libspconv.so and the CUDA 12
// runtime beside it) and writes its inputs: plan.txt and weights.bin (the exptool file as a layer list,
// gpu_check.py's anchor_plan says their form), features.f16 (the frame's features, float16 [N, C]) and
// indices.i32 (its coordinates, int32 [N, 4] as batch, z, y, x).
//
//   libspconv_anchor plan.txt weights.bin features.f16 indices.i32 output.f16 RUNS
//
// Builds the engine in float16, runs it 3 times to warm up and RUNS times timed, each run by CUDA events
// around forward() on one stream, writes the output (float16, dense) to output.f16 and prints, as its last
// line, {"version": ..., "median_ms": ..., "runs": ..., "output_shape": [...]}.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "spconv/engine.hpp"
#include "spconv/tensor.hpp"
#include "spconv/version.hpp"

namespace {

constexpr int kWarmUps = 3;  // the first runs allocate the engine's buffers

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::string Word(std::istream& plan) {
  std::string word;
  if (!(plan >> word)) throw std::runtime_error("plan.txt ends inside a line");
  return word;
}

// A list of the plan: its length, then its values.
template <typename T>
std::vector<T> List(std::istream& plan) {
  size_t count = 0;
  plan >> count;
  std::vector<T> values(count);
  for (T& value : values) plan >> value;
  if (!plan) throw std::runtime_error("plan.txt holds a broken list");
  return values;
}

// weights.bin, handed out front to back as the plan's convs ask for their tensors.
class Weights {
 public:
  explicit Weights(const std::string& path) : bytes_(ReadFile(path)) {}

  std::vector<unsigned short> Take(const std::vector<int>& shape) {
    size_t count = 1;
    for (int extent : shape) count *= static_cast<size_t>(extent);
    if (offset_ + 2 * count > bytes_.size()) throw std::runtime_error("weights.bin is shorter than plan.txt says");
    std::vector<unsigned short> values(count);
    std::memcpy(values.data(), bytes_.data() + offset_, 2 * count);
    offset_ += 2 * count;
    return values;
  }

  bool AllTaken() const { return offset_ == bytes_.size(); }

 private:
  std::vector<char> bytes_;
  size_t offset_ = 0;
};

struct Network {
  std::shared_ptr<spconv::Engine> engine;
  std::vector<int> grid;  // (z, y, x) of the input
};

// Every layer float16, as the exptool file (no dynamic ranges: not quantized) asks.
spconv::INode* Conv(spconv::EngineBuilder& builder, std::istream& plan, Weights& weights, spconv::ITensor* x,
                    const std::string& name, const std::string& output) {
  const std::string activation = Word(plan);
  int subm = 0, inverse = 0, output_bound = 0;
  plan >> subm >> inverse >> output_bound;
  std::string rulebook = Word(plan);
  if (rulebook == "-") rulebook.clear();
  const auto kernel = List<int>(plan), stride = List<int>(plan), padding = List<int>(plan), dilation = List<int>(plan);
  const auto weight_shape = List<int>(plan), bias_shape = List<int>(plan);
  const auto weight = weights.Take(weight_shape);
  const auto bias = weights.Take(bias_shape);
  return builder.push_sparse_conv(name.c_str(), x, weight, weight_shape, {}, bias, bias_shape, activation.c_str(),
                                  kernel, stride, padding, dilation, 0.0f, subm != 0, output_bound, rulebook.c_str(),
                                  spconv::Precision::Float16, spconv::Precision::Float16, output.c_str(), inverse != 0);
}

Network Build(const std::string& plan_path, const std::string& weights_path, cudaStream_t stream) {
  std::ifstream plan(plan_path);
  if (!plan) throw std::runtime_error("cannot read " + plan_path);
  Weights weights(weights_path);
  std::shared_ptr<spconv::EngineBuilder> builder = spconv::create_engine_builder();
  std::map<std::string, spconv::ITensor*> tensors;
  auto tensor = [&tensors](const std::string& name) {
    const auto found = tensors.find(name);
    if (found == tensors.end()) throw std::runtime_error("plan.txt uses " + name + " before any layer writes it");
    return found->second;
  };
  Network network;
  std::string op;
  while (plan >> op) {
    if (op == "input") {
      const std::string name = Word(plan);
      network.grid = List<int>(plan);
      tensors[name] = builder->push_input(name.c_str());
      continue;
    }
    if (op == "output") {
      builder->push_output(tensor(Word(plan)));
      continue;
    }
    const std::string name = Word(plan);
    spconv::ITensor* x = tensor(Word(plan));
    spconv::ITensor* y = op == "add" ? tensor(Word(plan)) : nullptr;
    const std::string output = Word(plan);
    spconv::INode* node = nullptr;
    if (op == "conv") {
      node = Conv(*builder, plan, weights, x, name, output);
    } else if (op == "add") {
      node = builder->push_add(name.c_str(), x, y, 0.0f, 0.0f, output.c_str(), spconv::Precision::Float16,
                               spconv::Precision::Float16);
    } else if (op == "relu") {
      node = builder->push_relu(name.c_str(), x, output.c_str());
    } else if (op == "dense") {
      const std::string format = Word(plan);
      const auto input_spatial_shape = List<int>(plan), output_shape = List<int>(plan);
      node = builder->push_dense(name.c_str(), x, format.c_str(), output.c_str(), input_spatial_shape, output_shape);
    } else if (op == "reshape") {
      node = builder->push_reshape(name.c_str(), x, List<int64_t>(plan), output.c_str());
    } else {
      throw std::runtime_error("plan.txt names an unknown layer: " + op);
    }
    if (node == nullptr) throw std::runtime_error("libspconv refused layer " + name);
    tensors[output] = node->output(0);
  }
  if (!weights.AllTaken()) throw std::runtime_error("weights.bin is longer than plan.txt says");
  if (network.grid.empty()) throw std::runtime_error("plan.txt names no input");
  network.engine = builder->build(spconv::Precision::Float16, stream);
  if (!network.engine) throw std::runtime_error("libspconv built no engine");
  return network;
}

// The frame on the device: features float16 [rows, channels], indices int32 [rows, 4].
struct Frame {
  void* features = nullptr;
  void* indices = nullptr;
  int64_t rows = 0, channels = 0;

  Frame(const std::string& features_path, const std::string& indices_path) {
    const std::vector<char> f = ReadFile(features_path), i = ReadFile(indices_path);
    rows = static_cast<int64_t>(i.size() / (4 * sizeof(int32_t)));
    if (rows == 0 || f.size() % (2 * rows) != 0) throw std::runtime_error("the features do not pair with the indices");
    channels = static_cast<int64_t>(f.size() / (2 * rows));
    Check(cudaMalloc(&features, f.size()), "cudaMalloc");
    Check(cudaMalloc(&indices, i.size()), "cudaMalloc");
    Check(cudaMemcpy(features, f.data(), f.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    Check(cudaMemcpy(indices, i.data(), i.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Frame() {
    cudaFree(features);
    cudaFree(indices);
  }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
};

void Feed(const Network& network, const Frame& frame) {
  spconv::SparseDTensor* input = network.engine->input(0);
  input->features().reference(frame.features, {frame.rows, frame.channels}, spconv::DataType::Float16);
  input->indices().reference(frame.indices, {frame.rows, 4}, spconv::DataType::Int32);
  input->set_grid_size(network.grid);
}

// The milliseconds of each timed run, by CUDA events around forward() on `stream`.
std::vector<float> Time(const Network& network, const Frame& frame, int runs, cudaStream_t stream) {
  cudaEvent_t begin = nullptr, end = nullptr;
  Check(cudaEventCreate(&begin), "cudaEventCreate");
  Check(cudaEventCreate(&end), "cudaEventCreate");
  std::vector<float> times;
  for (int run = 0; run < kWarmUps + runs; ++run) {
    Feed(network, frame);
    Check(cudaEventRecord(begin, stream), "cudaEventRecord");
    network.engine->forward(stream);
    Check(cudaEventRecord(end, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    if (run >= kWarmUps) times.push_back(ms);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return times;
}

double Median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2.0;
}

// Writes output 0 (float16) to `path`; its shape.
std::vector<int64_t> Save(const Network& network, const std::string& path, cudaStream_t stream) {
  const spconv::Tensor& output = network.engine->output(0)->features();
  if (output.dtype() != spconv::DataType::Float16) throw std::runtime_error("the output is not float16");
  std::vector<char> host(output.bytes());
  Check(cudaMemcpyAsync(host.data(), output.ptr(), host.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::ofstream(path, std::ios::binary).write(host.data(), static_cast<std::streamsize>(host.size()));
  return output.shape;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s plan.txt weights.bin features.f16 indices.i32 output.f16 RUNS\n", argv[0]);
    return 2;
  }
  try {
    const int runs = std::max(1, std::atoi(argv[6]));
    cudaStream_t stream = nullptr;
    Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    const Network network = Build(argv[1], argv[2], stream);
    const Frame frame(argv[3], argv[4]);
    const double median = Median(Time(network, frame, runs, stream));
    const std::vector<int64_t> shape = Save(network, argv[5], stream);
    std::string dims;
    for (int64_t extent : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(extent);
    std::printf("{\"version\": \"%s\", \"median_ms\": %.4f, \"runs\": %d, \"output_shape\": [%s]}\n", NVSPCONV_VERSION,
                median, runs, dims.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "libspconv_anchor: %s\n", error.what());
    return 1;
  }
}
