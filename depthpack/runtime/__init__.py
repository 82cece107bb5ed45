"""Running the packed forward fast: the Predictor (compile, CUDA graphs, AOTInductor packages), the
package loader, graph capture and timing. Never imports training, data rendering or evaluation."""
