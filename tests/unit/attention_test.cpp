// Tests for attention.hpp: mass validation, normalisation and the Eigen head/layer reductions.
#include <gtest/gtest.h>

#include <memdecay/core/attention.hpp>

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace md = memdecay;

TEST(Attention, ValidateMassAcceptsFiniteNonNegative) {
  const std::vector<float> ok{0.0f, 0.25f, 0.75f};
  EXPECT_NO_THROW(md::validate_mass<float>(ok, 3, "mass"));
}

TEST(Attention, ValidateMassNamesTheFirstBadIndex) {
  auto message = [](std::vector<float> m, std::size_t expected) {
    try {
      md::validate_mass<float>(m, expected, "per-token attention");
    } catch (const md::input_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({0.1f, 0.2f}, 3).find("has 2 entries, expected 3"), std::string::npos);
  EXPECT_NE(message({0.1f, NAN, -1.0f}, 3).find("[1] = nan"), std::string::npos);
  EXPECT_NE(message({0.1f, 0.0f, -1.0f}, 3).find("[2] = -1"), std::string::npos);
  EXPECT_NE(message({INFINITY}, 1).find("[0] = inf"), std::string::npos);
}

TEST(Attention, NormalizationScale) {
  EXPECT_EQ(md::normalization_scale<float>(md::attention_normalization::none, 500), 1.0f);
  EXPECT_EQ(md::normalization_scale<float>(md::attention_normalization::uniform, 500), 500.0f);
}

TEST(Attention, ReduceHeadsSumsAndAveragesColumns) {
  Eigen::MatrixXf heads(2, 3);
  heads << 0.5f, 0.25f, 0.25f,  //
      0.0f, 1.0f, 0.0f;
  const auto sum = md::reduce_heads(heads, md::head_reduction::sum);
  EXPECT_EQ(sum, (std::vector<float>{0.5f, 1.25f, 0.25f}));
  const auto mean = md::reduce_heads(heads, md::head_reduction::mean);
  EXPECT_EQ(mean, (std::vector<float>{0.25f, 0.625f, 0.125f}));
  // Row-major maps over engine buffers work too.
  const float buffer[] = {0.5f, 0.25f, 0.25f, 0.0f, 1.0f, 0.0f};
  Eigen::Map<const Eigen::Matrix<float, 2, 3, Eigen::RowMajor>> mapped(buffer);
  EXPECT_EQ(md::reduce_heads(mapped, md::head_reduction::sum), sum);
}

TEST(Attention, ReduceLayersOverAllRows) {
  std::vector<Eigen::MatrixXd> layers(2, Eigen::MatrixXd::Zero(2, 4));
  layers[0](0, 1) = 1.0;
  layers[0](1, 2) = 1.0;
  layers[1](0, 1) = 0.5;
  layers[1](0, 3) = 0.5;
  layers[1](1, 0) = 1.0;
  EXPECT_EQ(md::reduce_layers(layers, md::head_reduction::sum), (std::vector<double>{1.0, 1.5, 1.0, 0.5}));
  EXPECT_EQ(md::reduce_layers(layers, md::head_reduction::mean), (std::vector<double>{0.25, 0.375, 0.25, 0.125}));
}

TEST(Attention, ReduceLayersRejectsRaggedLayers) {
  std::vector<Eigen::MatrixXf> layers{Eigen::MatrixXf::Zero(2, 4), Eigen::MatrixXf::Zero(2, 5)};
  EXPECT_THROW((void)md::reduce_layers(layers, md::head_reduction::sum), md::input_error);
}
