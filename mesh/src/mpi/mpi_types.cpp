#include "mpi_types.hpp"

#include <algorithm>
#include <mutex>

#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"

namespace kshard::detail {
namespace {

template <class T, int OP>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = to_float(a[i]), y = to_float(b[i]);
    const float r = OP == 0 ? x + y : (OP == 1 ? std::max(x, y) : std::min(x, y));
    b[i] = from_float<T>(r);
  }
}

struct UserOps {
  MPI_Op ops[2][3];  // [bf16, f16][sum, max, min]
  bool created = false;
};
UserOps& user_ops() {
  static UserOps u;
  return u;
}
std::mutex ops_mu;

void create_ops() {
  UserOps& u = user_ops();
  MPI_Op_create(&reduce16<bfloat16_t, 0>, 1, &u.ops[0][0]);
  MPI_Op_create(&reduce16<bfloat16_t, 1>, 1, &u.ops[0][1]);
  MPI_Op_create(&reduce16<bfloat16_t, 2>, 1, &u.ops[0][2]);
  MPI_Op_create(&reduce16<float16_t, 0>, 1, &u.ops[1][0]);
  MPI_Op_create(&reduce16<float16_t, 1>, 1, &u.ops[1][1]);
  MPI_Op_create(&reduce16<float16_t, 2>, 1, &u.ops[1][2]);
  u.created = true;
}

}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::u8:
    case DType::e4m3:
    case DType::e5m2: return MPI_UINT8_T;
  }
  throw Error("no MPI datatype for dtype " + std::to_string(int(t)), "a kshard::DType");
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const int k = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
  if (t == DType::bf16 || t == DType::f16) {
    std::lock_guard<std::mutex> lock(ops_mu);
    if (!user_ops().created) create_ops();
    return user_ops().ops[t == DType::bf16 ? 0 : 1][k];
  }
  return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
}

void mpi_free_ops() {
  std::lock_guard<std::mutex> lock(ops_mu);
  UserOps& u = user_ops();
  if (!u.created) return;
  for (auto& row : u.ops)
    for (MPI_Op& o : row) MPI_Op_free(&o);
  u.created = false;
}

}  // namespace kshard::detail
